"""The tuner's verification memory (autotune/verification.Memory) in and out of status.autotune.verification.

Status is writable by whoever may write the status subresource: a value that does not parse, is negative or
names a time that is not RFC 3339 is read as absent, so a malformed status starts a verification afresh and
never causes a rollback (a rollback needs a baseline and evidence, which an empty memory does not have). A
well-formed one is trusted as the operator's own: a forged watch can cause a rollback, within the bounds like
any change. Tenants cannot forge one: the chart's kvpilot-edit role may read the status, not write it.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timezone

from kvpilot.api.status import (AutotuneStatus, EngineStatus, VerificationBar, VerificationSide, VerificationStatus,
                                VerificationWatch)
from kvpilot.api.timestamps import rfc3339
from kvpilot.autotune.constants import LASTING_BREAK_WINDOWS, PLANNING_HORIZON_SECONDS
from kvpilot.autotune.verification import Baseline, Memory, Watch, figures_from_window
from kvpilot.autotune.bars import Bar
from kvpilot.autotune.verify import CONFIRM_WINDOWS, Settle, Side
from kvpilot.desired.observed import Observed
from kvpilot.desired.tuning import when


def seconds_at(value: str | None, now: datetime) -> float | None:
    at = when(value, now)
    return at.timestamp() if at is not None else None


def stamp(seconds: float | None) -> str | None:
    return rfc3339(datetime.fromtimestamp(seconds, timezone.utc)) if seconds is not None and math.isfinite(seconds) \
        else None


def _count(value: int | None, scale: float = 1.0) -> float:
    return value / scale if value is not None and value >= 0 else 0.0


def side_of(record: VerificationSide | None) -> Side:
    """The pooled figures a status record holds (an absent or hostile record: none)."""
    if record is None or record.windows_milli is None or record.windows_milli <= 0:
        return Side()
    windows = record.windows_milli / 1e3
    last = record.last_share_permille
    return Side(windows, _count(record.seconds), _count(record.offered), _count(record.resolved), _count(record.good),
                _count(record.answered), windows * min(1.0, _count(record.share_permille, 1e3)),
                min(1.0, last / 1e3) if last is not None and last >= 0 else None,
                _count(record.successive_squares_micro, 1e6), _count(record.prompt_tokens) * _count(record.offered),
                _count(record.output_tokens) * _count(record.offered), _count(record.split),
                _count(record.tpot_missed), _count(record.ttft_missed))


def side_record(side: Side) -> VerificationSide | None:
    if side.windows <= 0:
        return None
    return VerificationSide(
        windows_milli=round(side.windows * 1e3), seconds=round(side.seconds), offered=round(side.offered),
        resolved=round(side.resolved), good=round(side.good), answered=round(side.answered),
        share_permille=round(1e3 * side.share_sum / side.windows),
        last_share_permille=round(1e3 * side.last_share) if side.last_share is not None else None,
        successive_squares_micro=round(1e6 * side.successive_squares), prompt_tokens=round(side.prompt_mean),
        output_tokens=round(side.output_mean), split=round(side.split), tpot_missed=round(side.tpot_missed),
        ttft_missed=round(side.ttft_missed))


def memory_of(status: AutotuneStatus | None, now: datetime) -> Memory:
    """The verification memory status holds (none when absent or unreadable)."""
    record = status.verification if status is not None else None
    if record is None:
        return Memory()
    # A time in the future is not one this operator wrote: a bar lasts at most a planning horizon from now, and a
    # window "seen" later than now would stop verification from taking any window.
    latest = now.timestamp() + PLANNING_HORIZON_SECONDS
    bars = tuple(Bar(b.direction == "Raise", b.batch_size, min(until, latest), _count(b.requests_per_minute) / 60.0,
                     _count(b.prompt_tokens)) for b in record.bars or ()
                 if b.direction and b.batch_size and b.batch_size > 0 and (until := seconds_at(b.until, now)) is not None)
    base = Baseline(record.baseline_batch_size, side_of(record.baseline),
                    settle_of(record.baseline_in_force_at, record.baseline_last_batch, record.baseline_calm_at, now),
                    min(max(0, record.baseline_missing_windows or 0), LASTING_BREAK_WINDOWS)) \
        if record.baseline_batch_size else Baseline()
    seen = seconds_at(record.seen_until, now)
    return Memory(baseline=base, watch=_watch_of(record.watch, now), bars=bars,
                  seen_until_s=seen if seen is not None and seen <= now.timestamp() else None,
                  pods=record.pods or "", decided_at_s=seconds_at(record.decided_at, now),
                  change_load=_load_of(record.change_requests_per_minute, record.change_prompt_tokens))


def _load_of(per_minute: int | None, prompt: int | None) -> tuple[float, float] | None:
    """The load status holds for the last change (None: not measured, or not a count)."""
    rate = _count(per_minute) / 60.0
    return (rate, float(_count(prompt))) if rate > 0 else None


def _watch_of(record: VerificationWatch | None, now: datetime) -> Watch | None:
    if record is None or not record.from_batch_size or not record.to_batch_size or record.from_batch_size < 1 \
            or record.to_batch_size < 1:
        return None
    changed = seconds_at(record.changed_at, now)
    if changed is None:
        return None
    return Watch(changed, record.from_batch_size, record.to_batch_size, side_of(record.before),
                 settle_of(record.in_force_at, record.last_batch, record.calm_at, now), side_of(record.after),
                 max(0, record.other_load or 0), worse_of(record.worse_windows))


def worse_of(value: int | None) -> int:
    """The judged windows in a row judged a rollback, as status holds them (absent or negative: none)."""
    return min(max(0, value or 0), CONFIRM_WINDOWS)


def settle_of(in_force: str | None, last_batch: int | None, calm: str | None, now: datetime) -> Settle:
    start = seconds_at(in_force, now)
    if start is None:
        return Settle()
    return Settle(start, float(last_batch) if last_batch is not None and last_batch >= 0 else None,
                  seconds_at(calm, now))


def verification_status(memory: Memory, previous: VerificationStatus | None) -> VerificationStatus:
    """The memory as status writes it, with the last verdict for a person to read."""
    last = memory.last
    prev = previous or VerificationStatus()
    w = memory.watch
    return VerificationStatus(
        outcome=last.outcome.value if last is not None else prev.outcome,
        reason=last.why.value if last is not None else prev.reason,
        message=last.message[:1024] if last is not None else prev.message,
        decided_at=stamp(memory.decided_at_s) if last is not None else prev.decided_at,
        watch=None if w is None else VerificationWatch(
            changed_at=stamp(w.change_at_s), from_batch_size=w.from_value, to_batch_size=w.to_value,
            before=side_record(w.baseline), after=side_record(w.after), in_force_at=stamp(w.settle.in_force_s),
            last_batch=round(w.settle.last_batch) if w.settle.last_batch is not None else None,
            calm_at=stamp(w.settle.calm_s), other_load=w.other_load, worse_windows=w.worse or None),
        baseline_batch_size=memory.baseline.limit, baseline=side_record(memory.baseline.side),
        baseline_in_force_at=stamp(memory.baseline.settle.in_force_s),
        baseline_last_batch=round(memory.baseline.settle.last_batch) if memory.baseline.settle.last_batch is not None
        else None, baseline_calm_at=stamp(memory.baseline.settle.calm_s),
        baseline_missing_windows=memory.baseline.missing_streak or None,
        bars=tuple(VerificationBar("Raise" if b.upward else "Lower", b.limit, stamp(b.until_s),
                                   round(b.offered_per_s * 60), round(b.prompt_mean)) for b in memory.bars) or None,
        seen_until=stamp(memory.seen_until_s), pods=memory.pods or None,
        change_requests_per_minute=round(memory.change_load[0] * 60) if memory.change_load else None,
        change_prompt_tokens=round(memory.change_load[1]) if memory.change_load else None)


def pods_digest(observed: Observed) -> str:
    """The serving pods and their restart counts, as a short digest (a change between two windows: a pod came,
    went or restarted)."""
    text = ",".join(sorted(f"{p.name}:{p.restarts}" for p in observed.pods))
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""


def observed_memory(status: EngineStatus, observed: Observed, *, current: int, rolling: bool, expected_pods: int,
                    now: datetime) -> Memory:
    """The memory with this pass's window taken in: the window's figures at the value in force (no value while
    a rollout is under way), restarts read from the pods."""
    memory = memory_of(status.autotune, now)
    w = observed.kv
    if w is None or w.window_seconds <= 0 or w.samples <= 0:
        return memory.observe(None, current, memory.pods, now.timestamp())
    figures = figures_from_window(w, now.timestamp(), None if rolling else current, expected_pods)
    return memory.observe(figures, current, pods_digest(observed), now.timestamp())
