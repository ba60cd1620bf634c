"""The autotuner's policy: raise, lower or hold the runtime max_batch_size. Pure, table-tested.

What an engineer does by hand — "start at 64, watch memory, raise slowly" — with the care expensive GPUs
need: every applied change restarts the pods, so the tuner only moves when the signal is clear
(hysteresis), the move is worth a restart (minimum step), enough time has passed (cooldown) and nothing is
rolling out. It reads the signals TensorRT-LLM actually gives:

* under GUARANTEED_NO_EVICT admission is bound by *reserved* blocks (prompt + max_tokens), so a queue with a
  batch below its limit and low utilization is not headroom: raising the limit would admit nobody;
* a full batch with a queue and KV headroom is the case where a higher limit helps;
* paused requests (MAX_UTILIZATION) or a pool above target mean the batch is too large for memory;
* a TPOT objective that is broken means the batch is too large for latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from kvpilot.api.models import AutotuneSpec
from kvpilot.desired.observed import KvWindow

HYSTERESIS = 0.05  # utilization band around the target where the tuner does not move
MIN_RELATIVE_STEP = 0.25  # smaller raises are not worth a pod restart
MIN_PROTECTIVE_STEP = 0.10  # lowering to protect memory or latency may be finer
MAX_RAISE_FACTOR = 2.0
MAX_LOWER_FACTOR = 0.5
MIN_SAMPLES = 3
SATURATION = 0.95  # the batch counts as full when its peak reaches 95% of the limit


@dataclass(frozen=True)
class TunerInput:
    current: int
    ceiling: int
    spec: AutotuneSpec
    window: KvWindow | None
    scheduler_policy: str
    rollout_in_progress: bool
    build_in_progress: bool
    last_applied_at: datetime | None
    now: datetime
    # The ceiling a rebuild may reach (the schema bound on build.maxBatchSize).
    rebuild_limit: int = 16384


@dataclass(frozen=True)
class Decision:
    action: str  # Raise | Lower | Hold | Rebuild
    target: int  # the runtime max_batch_size to run with (== current for Hold)
    reason: str
    message: str
    ceiling_request: int | None = None  # for Rebuild: the engine ceiling to build

    @property
    def changes(self) -> bool:
        return self.action in ("Raise", "Lower", "Rebuild")


def bounds(inp: TunerInput) -> tuple[int, int]:
    hi = min(inp.spec.max_batch_size, inp.ceiling)
    lo = min(inp.spec.min_batch_size, hi)
    return lo, hi


def _hold(inp: TunerInput, reason: str, message: str) -> Decision:
    return Decision("Hold", inp.current, reason, message)


def _move(inp: TunerInput, target: int, reason: str, message: str, min_step: float = MIN_RELATIVE_STEP) -> Decision:
    lo, hi = bounds(inp)
    target = max(lo, min(hi, target))
    if target == inp.current:
        return _hold(inp, reason, message + f"; already at the bound {target}")
    if abs(target - inp.current) < min_step * inp.current:
        return _hold(inp, "ChangeTooSmall", message + f"; {inp.current}->{target} is not worth a restart")
    action = "Raise" if target > inp.current else "Lower"
    return Decision(action, target, reason, message + f"; {inp.current}->{target}")


def _slo_broken(inp: TunerInput, w: KvWindow) -> str | None:
    slo = inp.spec.slo
    if slo is None:
        return None
    if slo.time_per_output_token_millis and w.tpot_p95_ms and w.tpot_p95_ms > slo.time_per_output_token_millis:
        return f"p95 TPOT {w.tpot_p95_ms:.0f}ms > objective {slo.time_per_output_token_millis}ms"
    return None


def _tpot_margin(inp: TunerInput, w: KvWindow) -> bool:
    """True when raising is unlikely to break the TPOT objective (within 80% of it, or no objective)."""
    slo = inp.spec.slo
    if slo is None or not slo.time_per_output_token_millis or not w.tpot_p95_ms:
        return True
    return w.tpot_p95_ms <= 0.8 * slo.time_per_output_token_millis


def decide(inp: TunerInput) -> Decision:
    """The decision for one tuning interval."""
    lo, hi = bounds(inp)
    if inp.current > hi or inp.current < lo:
        clamped = max(lo, min(hi, inp.current))
        action = "Lower" if clamped < inp.current else "Raise"
        return Decision(action, clamped, "OutOfBounds", f"{inp.current} is outside [{lo}, {hi}]; {inp.current}->{clamped}")
    if inp.build_in_progress or inp.rollout_in_progress:
        return _hold(inp, "RolloutInProgress", "A build or rollout is under way; observing only")
    w = inp.window
    if w is None or w.samples < MIN_SAMPLES or w.max_blocks <= 0:
        return _hold(inp, "InsufficientData", "Not enough warm metrics in the window")
    if inp.last_applied_at is not None:
        elapsed = (inp.now - inp.last_applied_at).total_seconds()
        if elapsed < inp.spec.cooldown_seconds:
            return _hold(inp, "Cooldown", f"Last change {elapsed:.0f}s ago (cooldown {inp.spec.cooldown_seconds}s)")
    return _decide_from_signals(inp, w, lo, hi)


def _decide_from_signals(inp: TunerInput, w: KvWindow, lo: int, hi: int) -> Decision:
    target_u = inp.spec.target_kv_cache_utilization_percent / 100
    cur = inp.current
    util = f"KV {w.peak_utilization:.0%} peak (target {target_u:.0%})"

    # Too large: memory (paused requests, pool over target) or latency (TPOT objective broken).
    if w.paused > 0:
        return _move(inp, math.floor(cur * MAX_LOWER_FACTOR), "RequestsPaused",
                     f"{w.paused} requests were paused for lack of KV blocks; {util}", MIN_PROTECTIVE_STEP)
    # Under GUARANTEED_NO_EVICT a full pool only delays admission (nothing is paused), so pressure alone
    # is a reason to lower only where the engine evicts.
    if w.peak_utilization > target_u + HYSTERESIS and inp.scheduler_policy == "MaxUtilization":
        scale = max(MAX_LOWER_FACTOR, target_u / w.peak_utilization)
        return _move(inp, math.floor(cur * scale), "KvCachePressure", f"{util} is above target", MIN_PROTECTIVE_STEP)
    broken = _slo_broken(inp, w)
    if broken:
        scale = max(MAX_LOWER_FACTOR, (inp.spec.slo.time_per_output_token_millis or 1) / (w.tpot_p95_ms or 1))  # type: ignore[union-attr]
        return _move(inp, math.floor(cur * scale), "TpotObjectiveBroken", broken, MIN_PROTECTIVE_STEP)

    # Too small: the batch is full, requests queue, and the pool has room.
    full = w.peak_active >= SATURATION * cur
    queued = w.mean_queued >= 1 or w.peak_queued >= max(2, cur // 8)
    if not queued:
        return _hold(inp, "NoQueue", f"No requests wait; the limit {cur} is not binding; {util}")
    if not full:
        return _hold(inp, "ReservationBound",
                     f"Requests wait while the batch ({w.peak_active}/{cur}) is not full: admission is bound by "
                     f"reserved KV blocks (GUARANTEED_NO_EVICT), not by max_batch_size; {util}")
    if w.peak_utilization >= target_u - HYSTERESIS:
        return _hold(inp, "AtTarget", f"The batch is full and {util} is at target")
    if not _tpot_margin(inp, w):
        return _hold(inp, "TpotNearObjective", "Raising would risk the TPOT objective")
    per_request = w.peak_used_blocks / max(1, w.peak_active)
    fit = math.floor(target_u * w.max_blocks / per_request) if per_request > 0 else hi
    wanted = min(fit, math.floor(cur * MAX_RAISE_FACTOR))
    if wanted > hi and hi == inp.ceiling and inp.spec.allow_rebuild and inp.ceiling < min(
        inp.spec.max_batch_size, inp.rebuild_limit
    ) and fit >= 1.5 * inp.ceiling:
        ceiling = min(inp.spec.max_batch_size, inp.rebuild_limit, 2 ** math.ceil(math.log2(fit)))
        return Decision("Rebuild", cur, "CeilingTooLow",
                        f"The pool fits about {fit} requests but the engine's ceiling is {inp.ceiling}; {util}; "
                        f"building a ceiling of {ceiling}", ceiling_request=ceiling)
    return _move(inp, wanted, "QueueWithHeadroom",
                 f"The batch is full ({w.peak_active}/{cur}), {w.mean_queued:.1f} requests wait on average, {util}")
