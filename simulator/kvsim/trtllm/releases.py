"""The TensorRT-LLM release kvsim plays: ``KVSIM_TRTLLM_RELEASE`` (default: the release the kvsim image stands
for, ``TRTLLM_VERSION``) picks what trtllm-serve accepts, exposes and does.

Facts and sources (NVIDIA/TensorRT-LLM; the operator keeps the same facts in
operator/kvpilot/trtllm/options/releases.yaml, and a test holds the two in agreement):
- 1.2.x: ``TrtLlmArgs`` has no ``perf_metrics_max_requests``; with ``return_perf_metrics`` on the TensorRT backend
  the server reads it and startup fails (issue #9678, release:1.2.0rc2; fixed by PR #10662 on main only). The
  collector (@ 89fd9b74 : tensorrt_llm/metrics/collector.py) exports unprefixed histograms and one counter, no
  gauges. ``validate_build_config_with_runtime_params`` clamps a runtime max_batch_size / max_num_tokens above the
  engine's with a warning (llm_args.py, index id 1090804222). ``SchedulerConfig`` has no ``waiting_queue_policy``.
- 1.3.0rc5 to rc20 (the row named ``1.3``): the field is on ``BaseLlmArgs`` (PR #10662), names are ``trtllm_``-prefixed with KV-cache and
  request gauges (PR #11243, #12545), ``waiting_queue_policy`` exists.
- 1.3.0rc21 and later (so the final 1.3.0 and every 1.3.N too), 1.4: the TensorRT backend is gone. The v1.3.0rc20 notes call rc20 "the last one supporting
  the TensorRT backend"; the migration guide docs/source/legacy/tensorrt-backend-removal.md lists ``trtllm-build``,
  ``convert_checkpoint.py`` and ``--backend tensorrt`` as removed, and trtllm-serve's ``--backend`` choices become
  ``pytorch``, ``_autodeploy`` (tests/unittest/api_stability/references/trtllm_serve_cli.yaml); PyPI's rc22, rc29
  and 1.4.0rc1 no longer require ``tensorrt`` (shared/reference/trtllm-forward.md section 1; whether rc21 itself
  still had it was not read: kvsim plays rc21 as PyTorch-only). kvsim then answers ``--backend tensorrt`` as click
  answers a value outside the choices (exit 2) and ``trtllm-build`` as a shell answers a missing command (127).
  The metric names are 1.3's (UNVERIFIED at those tags).
- 1.1: refuses a runtime limit above the engine's (``Value error, max_batch_size [2048] is greater than
  build_config.max_batch_size [64] in build_config``, a public 1.1.0 log, index id 52979530354).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

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
    tensorrt_backend: bool = True  # trtllm-build and --backend tensorrt exist

    @property
    def backends(self) -> tuple[str, ...]:
        """trtllm-serve's --backend choices in this release."""
        return ("pytorch", "tensorrt", "_autodeploy") if self.tensorrt_backend else ("pytorch", "_autodeploy")


RELEASES = {
    "1.1": Release("1.1", "1.1.0", False, "", False, False, False),
    "1.2.0": Release("1.2.0", "1.2.0", False, "", False, False, True),
    "1.2.1": Release("1.2.1", "1.2.1", False, "", False, False, True),
    "1.3": Release("1.3", "1.3.0rc20", True, "trtllm_", True, True, True),  # rc5 to rc20; reports the last
    "1.3.0rc21": Release("1.3.0rc21", "1.3.0rc21", True, "trtllm_", True, True, True, tensorrt_backend=False),
    "1.4": Release("1.4", "1.4.0rc1", True, "trtllm_", True, True, True, tensorrt_backend=False),
}
FIRST_RC_WITHOUT_TENSORRT = 21  # of the 1.3 line
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?$")


def _after_rc20(patch: str | None, rc: str | None) -> bool:
    """A 1.3 version released after 1.3.0rc20, so without the TensorRT backend: 1.3.0rc21 and later rcs, 1.3.0
    itself (a final release sorts after its rcs) and every 1.3.N, N >= 1 (rcs included). The bare row name ``1.3``
    (no patch) is kvsim's rc5-rc20 row."""
    if patch is None:
        return False
    if rc is None or int(patch) >= 1:
        return True
    return int(rc) >= FIRST_RC_WITHOUT_TENSORRT


def resolve(name: str | None) -> Release:
    """``1.2.0``, ``1.2.1``, ``1.2.0rc2``, ``1.3``, ``1.3.0rc7``, ``1.3.0rc22``, ``1.3.0``, ``1.4``, ``1.4.0rc1``,
    ``1.1.0`` -> the release; ValueError otherwise. A version that names an rc or a patch is what ``/version``
    reports on the rows without the TensorRT backend. ``1.3`` is the row name for rc5-rc20 (reporting 1.3.0rc20);
    the version ``1.3.0`` is the final release, after rc20, so PyTorch-only, as the operator reads an image tag."""
    raw = (name or TRTLLM_VERSION).strip()
    m = _VERSION.match(raw)
    if not m:
        raise ValueError(f"{ENV}={raw!r} is not a TensorRT-LLM version (one of {', '.join(RELEASES)})")
    line, exact = f"{m[1]}.{m[2]}", f"{m[1]}.{m[2]}.{m[3] or 0}"
    if line == "1.3" and _after_rc20(m[3], m[4]):
        line = exact = "1.3.0rc21"
    for key in (exact, line):
        if key in RELEASES:
            release = RELEASES[key]
            named = m[3] is not None or m[4] is not None
            return replace(release, version=raw) if named and not release.tensorrt_backend else release
    raise ValueError(f"{ENV}={raw!r}: kvsim plays {', '.join(RELEASES)}")
