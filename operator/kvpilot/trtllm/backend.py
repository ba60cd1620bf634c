"""Which TensorRT-LLM backend an engine runs, and the refusal of a TensorRT engine where the release has none.

TensorRT-LLM removed the TensorRT backend after 1.3.0rc20: no ``trtllm-build``, no ``convert_checkpoint.py``, no
``--backend tensorrt`` (docs/source/legacy/tensorrt-backend-removal.md; the rows in ``options/releases.yaml``). A
TensorRT engine on such an image would fail inside its build Job after the download; kvpilot refuses it before
anything runs, with the image and the way forward, wherever the release is known: at admission from the tag
(api/schema_build.py), in ``kvpilot render``, when planning (the operator's default image, what a Job recorded),
and in the build Job itself, whose probe reads the version inside the image (``probe.py``).
"""

from __future__ import annotations

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm.surface import NEWER, Surface, release_of_version, releases

MIGRATION_DOC = "docs/migration-pytorch.md"
# kvsim plays a named release: KVSIM_TRTLLM_RELEASE in the engine's runtime env, else the release the kvsim image
# stands for (kvsim's TRTLLM_VERSION). The operator renders for the same surface.
KVSIM_RELEASE_ENV = "KVSIM_TRTLLM_RELEASE"
KVSIM_DEFAULT_RELEASE = "1.2.0"


def kvsim_release(spec: InferenceEngineSpec) -> str:
    """The TensorRT-LLM release a simulated engine's kvsim plays, as named (KVSIM_TRTLLM_RELEASE)."""
    named = next((v.value for v in spec.runtime.env if v.name == KVSIM_RELEASE_ENV and v.value), None)
    return named or KVSIM_DEFAULT_RELEASE


def kvsim_row(name: str) -> str:
    """The release-table row kvsim plays for ``name``, by kvsim's own rules (simulator/kvsim/trtllm/releases.py,
    held equal by tests/unit/test_release_tags.py): a row's name is that row (``1.3``: rc5-rc20); any version is the
    row its version falls in, as for an image tag (``1.3.0``, the final release after rc20: PyTorch only)."""
    if name in releases():
        return name
    return release_of_version(name)


def way_forward(spec: InferenceEngineSpec) -> str:
    """The spec change that serves the same model without a TensorRT engine."""
    if spec.runtime.backend == "simulated":
        return "set runtime.simulation.backend: pytorch (kvsim plays the PyTorch backend)"
    return f"set runtime.backend: pytorch (no engine build; {MIGRATION_DOC})"


def refusal(spec: InferenceEngineSpec, image: str, surface: Surface) -> str | None:
    """Why this engine cannot run on ``image`` (None when it can): a TensorRT engine on a release without one."""
    if spec.trtllm_backend != "tensorrt" or not surface.tensorrt_removed:
        return None
    if spec.runtime.backend == "simulated":
        what = f"kvsim playing TensorRT-LLM {kvsim_release(spec)} ({KVSIM_RELEASE_ENV})"
    else:
        what = f"image {image}"
    release = "a release newer than any kvpilot knows" if surface.release == NEWER else f"release {surface.release}"
    return (f"runtime.backend {spec.runtime.backend} builds a TensorRT engine, but {what} is TensorRT-LLM {release}, "
            "which has no TensorRT backend (TensorRT-LLM removed trtllm-build and --backend tensorrt after "
            f"1.3.0rc20): {way_forward(spec)}")
