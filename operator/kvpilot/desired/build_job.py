"""The build Job: one pod on the serving GPU product that builds and publishes one engine."""

from __future__ import annotations

from typing import Any

from kvpilot.api.models import InferenceEngineSpec, ObjectRef
from kvpilot.desired import labels as L
from kvpilot.desired import pod_parts as P
from kvpilot.trtllm.build import model_cache_key, uses_quantize_script
from kvpilot.trtllm.build_script import build_script

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
    labels = {
        **L.MANAGED_BY,
        "app.kubernetes.io/name": "inference-engine",
        L.COMPONENT_LABEL: "build",
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
    if calibration is not None and uses_quantize_script(b) and spec.runtime.backend != "simulated":
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
    container = {
        "name": "build",
        "image": image,
        "command": ["bash", "-c"],
        "args": [build_script(spec, fingerprint, image, ceiling)],
        "env": (P.env(spec) + P.credentials_env(spec)) or None,
        "resources": P.resources(b.resources, b.gpus),
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
