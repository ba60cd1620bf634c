"""The build Job: one pod on the serving GPU product that builds and publishes one engine — or, on the PyTorch
backend, prepares and publishes one checkpoint (trtllm/prepare.py), with the same cache guarantees."""

from __future__ import annotations

from typing import Any

from kvpilot.api.models import InferenceEngineSpec, ObjectRef
from kvpilot.desired import labels as L
from kvpilot.desired import pod_parts as P
from kvpilot.trtllm.build import calibrates, model_cache_key
from kvpilot.trtllm.build_script import build_script, prepare_script
from kvpilot.trtllm.probe import REFUSED_EXIT_CODE
from kvpilot.trtllm.serve import serving_surface

# Keep finished Jobs a day so `kubectl get job -o yaml` and the logs stay readable; the engine index,
# not the Job, is what records a finished build.
TTL_SECONDS_AFTER_FINISHED = 86400


def build_job(
    owner: ObjectRef,
    spec: InferenceEngineSpec,
    fingerprint: str,
    *,
    image: str,
    claim: str,
    ceiling: int,
    claim_uid: str = "",
) -> dict[str, Any]:
    b = spec.build
    prepares = spec.prepares_checkpoint
    role = "prepare" if prepares else "build"  # the container's name; both are the engine's build component
    labels = {
        **L.MANAGED_BY,
        "app.kubernetes.io/name": "inference-engine",
        L.COMPONENT_LABEL: "build",  # what the chart's NetworkPolicy for build pods selects (no ingress)
        L.BACKEND_LABEL: spec.runtime.backend,
        L.FINGERPRINT_LABEL: fingerprint[:32],
    }
    mounts = [P.cache_mount(read_only=False)]
    volumes = [P.cache_volume(claim, read_only=False)]
    model_volume = P.model_volume(spec)
    if model_volume is not None and spec.runtime.backend != "simulated":
        volumes.append(model_volume)
        mounts.append(P.model_mount())
    calibration = P.calibration_volume(spec)
    if calibration is not None and calibrates(spec):
        volumes.append(calibration[0])
        mounts.append(calibration[1])
    shm = P.shm_volume(b.gpus)
    if shm:
        volumes.append(shm[0])
        mounts.append(shm[1])
    init = None
    if spec.model.scheme == "s3" and spec.runtime.backend != "simulated":
        dest = f"/engines/.models/{model_cache_key(spec.model.source, spec.model.revision)}"
        init = [P.s3_sync_container(spec, dest, [P.cache_mount(read_only=False)])]
    if prepares:  # the warm-up serves at the spec's limit, with the YAML serving renders for this image
        surface = serving_surface(spec, image, None)[0]
        script = prepare_script(spec, fingerprint, image, spec.batching.max_batch_size, surface)
    else:
        script = build_script(spec, fingerprint, image, ceiling)
    container = {
        "name": role,
        "image": image,
        "command": ["bash", "-c"],
        "args": [script],
        "env": (P.env(spec) + P.credentials_env(spec)) or None,
        "resources": P.resources(b.resources, spec.gpus_per_pod),  # a multi-node engine builds on one node
        "volumeMounts": mounts,
        "securityContext": P.container_security_context(),
        # On failure the last log lines become the termination message: the operator copies it into the
        # InferenceEngine's EngineReady condition, so `kubectl get ie` says why a build failed.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": L.build_job_name(fingerprint, claim, claim_uid),
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": {
                L.FINGERPRINT_ANNOTATION: fingerprint,
                "serving.kvpilot.io/model": spec.model.source,
                "serving.kvpilot.io/claim": claim,
            },
            "ownerReferences": [L.owner_reference(owner, controller=False)],
        },
        "spec": {
            "backoffLimit": b.backoff_limit,
            "activeDeadlineSeconds": b.timeout_seconds,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            # An image without the TensorRT backend refuses the build (trtllm/probe.py): no retry can help.
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                "containerName": role, "operator": "In", "values": [REFUSED_EXIT_CODE]}}]}
            if spec.runtime.backend == "tensorrt" else None,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,  # a build never talks to the API server
                    "securityContext": P.pod_security_context(spec),
                    "nodeSelector": P.node_selector(spec),
                    "tolerations": P.tolerations(spec),
                    "initContainers": init,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    pruned: dict[str, Any] = P.prune(job)
    return pruned
