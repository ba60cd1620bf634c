"""The TensorRT-LLM release kvsim plays: ``KVSIM_TRTLLM_RELEASE`` (default: the release the kvsim image stands
for, ``TRTLLM_VERSION``) picks what trtllm-serve accepts, exposes and does.

Facts and sources (NVIDIA/TensorRT-LLM; the operator keeps the same facts in
operator/kvpilot/trtllm/options/releases.yaml, and a test holds the two in agreement):
- 1.2.x: ``TrtLlmArgs`` has no ``perf_metrics_max_requests``; with ``return_perf_metrics`` on the TensorRT backend
  the server reads it and startup fails (issue #9678, release:1.2.0rc2; fixed by PR #10662 on main only). The
  collector (@ 89fd9b74 : tensorrt_llm/metrics/collector.py) exports unprefixed histograms and one counter, no
  gauges. ``validate_build_config_with_runtime_params`` clamps a runtime max_batch_size / max_num_tokens above the
  engine's with a warning (llm_args.py, index id 1090804222). ``SchedulerConfig`` has no ``waiting_queue_policy``.
- 1.3.x (rc5+): the field is on ``BaseLlmArgs`` (PR #10662), names are ``trtllm_``-prefixed with KV-cache and
  request gauges (PR #11243, #12545), ``waiting_queue_policy`` exists.
- 1.1: refuses a runtime limit above the engine's (``Value error, max_batch_size [2048] is greater than
  build_config.max_batch_size [64] in build_config``, a public 1.1.0 log, index id 52979530354).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import TRTLLM_VERSION

ENV = "KVSIM_TRTLLM_RELEASE"


@dataclass(frozen=True)
class Release:
    name: str
    version: str  # what /version and the engine's config.json report
    trt_has_perf_metrics_max_requests: bool
    prometheus_prefix: str  # "" (1.2's collector) or "trtllm_"
    iteration_gauges: bool  # KV-cache and request gauges on /prometheus/metrics
    waiting_queue_policy: bool  # SchedulerConfig.waiting_queue_policy exists
    clamps_runtime_limits: bool  # True: warn and use the engine's; False: refuse (1.1)


RELEASES = {
    "1.1": Release("1.1", "1.1.0", False, "", False, False, False),
    "1.2.0": Release("1.2.0", "1.2.0", False, "", False, False, True),
    "1.2.1": Release("1.2.1", "1.2.1", False, "", False, False, True),
    "1.3": Release("1.3", "1.3.0", True, "trtllm_", True, True, True),
}
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:rc\d+)?$")


def resolve(name: str | None) -> Release:
    """``1.2.0``, ``1.2.1``, ``1.2.0rc2``, ``1.3``, ``1.3.0rc7``, ``1.1.0`` -> the release; ValueError otherwise."""
    raw = (name or TRTLLM_VERSION).strip()
    m = _VERSION.match(raw)
    if not m:
        raise ValueError(f"{ENV}={raw!r} is not a TensorRT-LLM version (one of {', '.join(RELEASES)})")
    line, exact = f"{m[1]}.{m[2]}", f"{m[1]}.{m[2]}.{m[3] or 0}"
    for key in (exact, line):
        if key in RELEASES:
            return RELEASES[key]
    raise ValueError(f"{ENV}={raw!r}: kvsim plays {', '.join(RELEASES)}")
