"""Pod-spec pieces shared by the build Job and the serving Deployment (they must land on the same GPUs)."""

from __future__ import annotations

from typing import Any

from kvpilot.api.models import InferenceEngineSpec, Resources
from kvpilot.trtllm.build import CACHE_MOUNT, CALIBRATION_MOUNT, MODEL_MOUNT

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.27.0"


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
    return {"limits": limits, "requests": requests}


def env(spec: InferenceEngineSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sim = spec.runtime.simulation
    if sim is not None:
        out += [
            {"name": "KVSIM_PROFILE", "value": sim.profile},
            {"name": "KVSIM_SPEEDUP", "value": str(sim.speedup_ratio)},
            {"name": "KVSIM_STARTUP_SECONDS", "value": str(sim.startup_seconds)},
            {"name": "KVSIM_BUILD_SECONDS", "value": str(sim.build_seconds)},
        ]
    for var in spec.runtime.env:
        out.append({"name": var.name, "value": var.value or ""})
    return out


def credentials_env_from(spec: InferenceEngineSpec) -> list[dict[str, Any]] | None:
    ref = spec.model.credentials_secret_ref
    return [{"secretRef": {"name": ref.name}}] if ref else None


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
        "envFrom": credentials_env_from(spec),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


KVSIM_UID = 10001  # the kvsim image's user (images/kvsim/Dockerfile)


def pod_security_context(spec: InferenceEngineSpec) -> dict[str, Any] | None:
    """The kvsim image runs as a non-root user: give it group ownership of the cache volume it writes.
    NVIDIA's TensorRT-LLM images run as root and get the runtime's defaults."""
    if spec.runtime.backend != "simulated" or spec.runtime.image:
        return None
    return {"runAsNonRoot": True, "runAsUser": KVSIM_UID, "fsGroup": KVSIM_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


_MEANINGFUL_EMPTY = {"emptyDir"}  # `emptyDir: {}` is the volume's source, not an absent value


def prune(obj: Any) -> Any:
    """Drop None values and empty containers so rendered manifests stay readable and apply cleanly."""
    if isinstance(obj, dict):
        out = {k: prune(v) for k, v in obj.items() if v is not None}
        return {k: v for k, v in out.items() if v not in ({}, []) or k in _MEANINGFUL_EMPTY}
    if isinstance(obj, list):
        return [prune(v) for v in obj]
    return obj
