"""The runtime max_batch_size in force, and the autotuner's decision folded into status.

The value lives in ``status.batching`` (never in spec: a GitOps tool owns spec). A tuned value survives
while tuning applies (autotune enabled, mode Auto) and until the user changes ``spec.batching.maxBatchSize``,
which resets the tuner to the new starting point. Its provenance (``source``) is kept apart from the reason,
so a tuned value clamped to a lower engine ceiling stays tuned.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from enum import StrEnum

from kvpilot.api.timestamps import rfc3339
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.enums import MAX_BATCH
from kvpilot.api.status import (Action, AutotuneStatus, BatchingSource, BatchingStatus, DecisionRecord,
                                VerificationStatus)
from kvpilot.api.status_schema import HISTORY_LIMIT
from kvpilot.autotune.constants import MIN_RELATIVE_STEP
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.reasons import TunerReason


class BatchingReason(StrEnum):
    """``status.batching.reason``: why this value is in force (a user may also have hand-edited another)."""

    SPEC_VALUE = "SpecValue"
    AUTOTUNE_RAISED = "AutotuneRaised"
    AUTOTUNE_LOWERED = "AutotuneLowered"
    AUTOTUNE_ROLLED_BACK = "AutotuneRolledBack"  # a change verification found harmful, undone (issue 18)
    ENGINE_CEILING = "EngineCeiling"


def tuning_applies(spec: InferenceEngineSpec) -> bool:
    return spec.autotune.enabled and spec.autotune.mode == "Auto"


def value_in_force(spec: InferenceEngineSpec, previous: BatchingStatus, ceiling: int | None) -> tuple[int, str, str]:
    """(value, reason, message) before this interval's decision."""
    spec_value = spec.batching.max_batch_size
    if (
        tuning_applies(spec)
        and previous.source == BatchingSource.AUTOTUNE
        and previous.spec_value == spec_value
        and previous.max_batch_size
    ):
        value = previous.max_batch_size
        # A tuned value always has its reason; a hand-edited status without one still reads as tuned.
        reason = previous.reason or (BatchingReason.AUTOTUNE_RAISED if value > spec_value else BatchingReason.AUTOTUNE_LOWERED)
        message = previous.message or ""
    else:
        value, reason, message = spec_value, BatchingReason.SPEC_VALUE, "spec.batching.maxBatchSize"
    limit = ceiling if ceiling is not None else MAX_BATCH
    if value > limit:
        return limit, BatchingReason.ENGINE_CEILING, f"{value} exceeds the engine's ceiling {limit}"
    return value, reason, message


def batching_status(
    spec: InferenceEngineSpec, previous: BatchingStatus, *, value: int, reason: str, message: str,
    ceiling: int | None, now: datetime,
) -> BatchingStatus:
    changed = previous.max_batch_size != value
    # A prefix, not the two members: a hand-edited status may carry another Autotune* reason, which reads as tuned.
    tuned = reason.startswith("Autotune") or (reason == BatchingReason.ENGINE_CEILING
                                              and previous.source == BatchingSource.AUTOTUNE)
    return BatchingStatus(
        source=BatchingSource.AUTOTUNE if tuned else BatchingSource.SPEC,
        max_batch_size=value,
        reason=reason,
        message=message[:1024],
        changed_at=rfc3339(now) if changed or not previous.changed_at else previous.changed_at,
        summary=f"{value}/{ceiling}" if ceiling is not None else str(value),
        spec_value=spec.batching.max_batch_size,
    )


def decision_record(decision: Decision, current: int, applied: bool, now: datetime) -> DecisionRecord:
    return DecisionRecord(
        at=rfc3339(now),
        action=decision.action,
        from_batch_size=current,
        to_batch_size=decision.ceiling_request if decision.action == Action.REBUILD else decision.target,
        reason=decision.reason,
        message=decision.message[:1024],
        applied=applied,
    )


def autotune_status(
    previous: AutotuneStatus, decision: Decision | None, *, current: int, applied: bool, now: datetime,
    spec_ceiling: int = 0, verification: VerificationStatus | None = None,
) -> AutotuneStatus:
    """Recommendation (refreshed only when it changes, to keep status writes rare), bounded history, and what
    verification keeps (``verification``: None leaves it as it was)."""
    if verification is not None:
        previous = replace(previous, verification=verification)
    if decision is None:
        return previous
    record = decision_record(decision, current, applied, now)
    old = previous.recommendation or DecisionRecord()
    same = (old.action, old.reason, old.applied, old.from_batch_size) == (
        record.action, record.reason, record.applied, record.from_batch_size)
    if same and not applied:
        # The same advice with a target that jitters window to window is not news (no Event, no history).
        moved = abs((record.to_batch_size or 0) - (old.to_batch_size or 0))
        same = moved < MIN_RELATIVE_STEP * max(1, old.to_batch_size or 1)
    out = previous
    if not same:
        out = replace(out, recommendation=record)
        if decision.changes:
            out = replace(out, history=(record, *(previous.history or ()))[:HISTORY_LIMIT])
    if decision.recheck_later:
        out = replace(out, what_if_declined_at=rfc3339(now))  # the policy reruns the simulation only a period later
    if decision.reason == TunerReason.TRAFFIC_SHIFTING:
        out = replace(out, what_if_declined_at=None)  # a decline for the old traffic says nothing of the new
    if applied:
        out = replace(out, what_if_declined_at=None, last_applied_at=rfc3339(now))
        if decision.action == Action.REBUILD and decision.ceiling_request:
            out = replace(out, ceiling_request=decision.ceiling_request, ceiling_request_from=spec_ceiling)
    return out
