"""Pod-spec pieces shared by the build Job and the serving Deployment (they must land on the same GPUs)."""

from __future__ import annotations

from typing import Any

from kvpilot.api import reserved_env as E
from kvpilot.api.models import InferenceEngineSpec, Resources
from kvpilot.trtllm.build import CACHE_MOUNT, CALIBRATION_MOUNT, MODEL_MOUNT

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.27.0"
EPHEMERAL_STORAGE = "ephemeral-storage"
DEFAULT_EPHEMERAL_REQUEST = "1Gi"


def image_for(spec: InferenceEngineSpec, kvsim_image: str, default_image: str) -> str:
    """The runtime image in effect: the spec's, else kvsim's for simulated, else the TensorRT-LLM release."""
    if spec.runtime.image:
        return spec.runtime.image
    return kvsim_image if spec.runtime.backend == "simulated" else default_image


def node_selector(spec: InferenceEngineSpec) -> dict[str, str] | None:
    selector = dict(spec.serving.node_selector or {})
    if spec.serving.gpu_product:
        selector[GPU_PRODUCT_LABEL] = spec.serving.gpu_product
    return selector or None


def tolerations(spec: InferenceEngineSpec) -> list[dict[str, Any]] | None:
    out = []
    for t in spec.serving.tolerations:
        item = {
            "key": t.key,
            "operator": t.operator,
            "value": t.value,
            "effect": t.effect,
            "tolerationSeconds": t.toleration_seconds,
        }
        out.append({k: v for k, v in item.items() if v is not None})
    return out or None


def resources(user: Resources, gpus: int) -> dict[str, Any]:
    """User cpu/memory plus the GPU count, which is derived from the parallel sizes and never asked of users."""
    limits = dict(user.limits or {})
    requests = dict(user.requests or {})
    limits[GPU_RESOURCE] = str(gpus)
    requests[GPU_RESOURCE] = str(gpus)
    # Logs and the writable layer (Python caches, /tmp) need some node disk: request it so the scheduler
    # counts it and the kubelet evicts a runaway writer instead of filling the node.
    if EPHEMERAL_STORAGE not in limits:  # with a limit alone, Kubernetes defaults the request to it
        requests.setdefault(EPHEMERAL_STORAGE, DEFAULT_EPHEMERAL_REQUEST)
    return {"limits": limits, "requests": requests}


def env(spec: InferenceEngineSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sim = spec.runtime.simulation
    if sim is not None:
        out += [
            {"name": E.KVSIM_PROFILE, "value": sim.profile},
            {"name": E.KVSIM_SPEEDUP, "value": str(sim.speedup_ratio)},
            {"name": E.KVSIM_STARTUP_SECONDS, "value": str(sim.startup_seconds)},
            {"name": E.KVSIM_BUILD_SECONDS, "value": str(sim.build_seconds)},
        ]
    for var in spec.runtime.env:
        out.append({"name": var.name, "value": var.value or ""})
    return out


HF_TOKEN_KEY = E.HF_TOKEN
AWS_KEYS = ((E.AWS_ACCESS_KEY_ID, False), (E.AWS_SECRET_ACCESS_KEY, False), (E.AWS_SESSION_TOKEN, True),
            (E.AWS_REGION, True))


def _secret_key(secret: str, key: str, optional: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": key, "valueFrom": {"secretKeyRef": ref}}


def credentials_env(spec: InferenceEngineSpec) -> list[dict[str, Any]]:
    """Only HF_TOKEN comes from the credentials Secret, by key: ``envFrom`` would import every key the
    Secret holds (other services' tokens included) into a container that runs user-chosen code."""
    ref = spec.model.credentials_secret_ref
    if ref is None or spec.model.scheme != "hf":
        return []
    return [_secret_key(ref.name, HF_TOKEN_KEY, optional=False)]


def s3_credentials_env(spec: InferenceEngineSpec) -> list[dict[str, Any]]:
    """The AWS CLI's keys for the s3:// sync container only (session token and region are optional)."""
    ref = spec.model.credentials_secret_ref
    if ref is None:
        return []
    return [_secret_key(ref.name, key, optional) for key, optional in AWS_KEYS]


def cache_volume(claim: str, read_only: bool) -> dict[str, Any]:
    return {"name": "engines", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}


def cache_mount(read_only: bool) -> dict[str, Any]:
    return {"name": "engines", "mountPath": CACHE_MOUNT, "readOnly": read_only}


def model_volume(spec: InferenceEngineSpec) -> dict[str, Any] | None:
    """pvc:// sources are mounted read-only; s3:// sources are synced into an emptyDir (pytorch serving)."""
    if spec.model.scheme == "pvc":
        claim = spec.model.location.partition("/")[0]
        return {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    return None


def model_mount() -> dict[str, Any]:
    return {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}


def calibration_volume(spec: InferenceEngineSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A pvc:// calibration dataset's claim, read-only, for quantize.py on air-gapped clusters."""
    dataset = spec.build.calibration.dataset
    if not dataset.startswith("pvc://"):
        return None
    claim = dataset.removeprefix("pvc://").partition("/")[0]
    return ({"name": "calibration", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
            {"name": "calibration", "mountPath": CALIBRATION_MOUNT, "readOnly": True})


def shm_volume(gpus: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """NCCL between ranks needs more than the container runtime's 64 MiB /dev/shm."""
    if gpus <= 1:
        return None
    return {"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "dshm", "mountPath": "/dev/shm"}


def s3_sync_container(spec: InferenceEngineSpec, dest: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """Copy an s3:// prefix with the AWS CLI (not in the TensorRT-LLM image) before the main container."""
    return {
        "name": "fetch-model",
        "image": AWS_CLI_IMAGE,
        "command": ["aws", "s3", "sync", spec.model.source, dest, "--only-show-errors"],
        "env": s3_credentials_env(spec) or None,
        "volumeMounts": mounts,
        "resources": {"requests": {EPHEMERAL_STORAGE: "64Mi"}, "limits": {EPHEMERAL_STORAGE: "1Gi"}},
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


KVSIM_UID = 10001  # the kvsim image's user (images/kvsim/Dockerfile)


def pod_security_context(spec: InferenceEngineSpec) -> dict[str, Any]:
    """Seccomp RuntimeDefault for every pod; a non-root user where the image allows one.

    NVIDIA's TensorRT-LLM release image declares no USER (docker/Dockerfile.multi's release stage), so it runs
    as root and kvpilot cannot force another user on it without breaking it; ``runtime.runAsUser`` opts in for
    images that allow it. The kvsim image runs as uid 10001. fsGroup lets the user write the cache volume."""
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    user, group = spec.runtime.run_as_user, spec.runtime.run_as_group
    if user is None and spec.runtime.backend == "simulated" and not spec.runtime.image:
        user, group = KVSIM_UID, group or KVSIM_UID
    if user is not None:
        ctx.update(runAsNonRoot=True, runAsUser=user)
    if group is not None or user is not None:
        ctx.update(runAsGroup=group or user, fsGroup=group or user)
    return ctx


def container_security_context() -> dict[str, Any]:
    """No privilege escalation and no Linux capabilities: neither trtllm-build nor trtllm-serve needs any
    (GPUs come from the device plugin, not from privileges)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False}


_MEANINGFUL_EMPTY = {"emptyDir"}  # `emptyDir: {}` is the volume's source, not an absent value


def prune(obj: Any) -> Any:
    """Drop None values and empty containers so rendered manifests stay readable and apply cleanly."""
    if isinstance(obj, dict):
        out = {k: prune(v) for k, v in obj.items() if v is not None}
        return {k: v for k, v in out.items() if v not in ({}, []) or k in _MEANINGFUL_EMPTY}
    if isinstance(obj, list):
        return [prune(v) for v in obj]
    return obj
