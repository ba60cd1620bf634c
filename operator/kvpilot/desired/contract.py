"""Two conditions about what the operator reads and renders by, so neither problem is silent:

- ``ReleaseContract``: which TensorRT-LLM release surface serving renders for, and whether the image is what its
  tag says (a mismatch is reported and served by the recorded surface, never a crash loop).
- ``MetricsValid``: whether the serving pods' metrics were usable in the last window (a malformed payload is a
  rejected sample; a sample from another engine is ignored; either is named here).
"""

from __future__ import annotations

from kvpilot.api.conditions import Condition, false, true
from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.surface import CONSERVATIVE, NEWER, Surface

RELEASE_CONTRACT = "ReleaseContract"
METRICS_VALID = "MetricsValid"


def release_condition(image: str, surface: Surface, how: str, mismatch: str | None) -> Condition:
    if how == "refused" and mismatch:  # a TensorRT engine on a release without the TensorRT backend (trtllm/backend.py)
        return false(RELEASE_CONTRACT, "BackendRemoved", mismatch)
    if mismatch:
        return false(RELEASE_CONTRACT, "ReleaseMismatch", mismatch)
    if surface.release == NEWER:
        return false(RELEASE_CONTRACT, "UnknownRelease",
                     f"Image {image} is a TensorRT-LLM release newer than any kvpilot knows: serving renders the "
                     "PyTorch-only conservative surface. Run hack/trtllm-contract-check.sh on the image and add its "
                     "row (docs/trtllm-releases.md)")
    if surface.release == CONSERVATIVE:
        return false(RELEASE_CONTRACT, "UnknownRelease",
                     f"Image {image} names no TensorRT-LLM release kvpilot knows: serving renders the most "
                     "conservative surface (no return_perf_metrics on TensorRT; latency histograms may be absent). "
                     "Run hack/trtllm-contract-check.sh on the image and add its row (docs/trtllm-releases.md)")
    where = {"recorded": "as recorded by the build Job", "tag": "as its tag names",
             "kvsim": "as kvsim plays it (KVSIM_TRTLLM_RELEASE)"}.get(how, how)
    return true(RELEASE_CONTRACT, "Matches", f"Image {image} is TensorRT-LLM release {surface.release} ({where})")


def metrics_condition(window: KvWindow | None) -> Condition | None:
    """None when there is no window (nothing sampled yet: the previous condition stays)."""
    if window is None:
        return None
    if window.rejected_samples:
        return false(METRICS_VALID, "SamplesRejected",
                     f"{window.rejected_samples} metrics samples rejected or ignored in the last window "
                     f"({window.samples} accepted); latest: {window.rejection}")
    return true(METRICS_VALID, "Accepted", f"{window.samples} samples from {window.pods} pods in the last window")
