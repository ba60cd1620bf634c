"""Standard conditions (metav1.Condition) for InferenceEngine status.

Kubernetes API conventions: PascalCase types and reasons, ``lastTransitionTime`` only moves when the
status flips, every condition carries the generation it was computed from. No ``phase`` field.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from kvpilot.api.status import ConditionRecord, ConditionStatus

from kvpilot.api.timestamps import rfc3339

ENGINE_READY = "EngineReady"
AVAILABLE = "Available"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CONDITION_TYPES = (ENGINE_READY, AVAILABLE, PROGRESSING, DEGRADED)
MESSAGE_LIMIT = 2048

# Every reason kvpilot computes (a reason read back from status may be any string: an older operator's).
ConditionReason = Literal[
    # EngineReady
    "NoBuildRequired", "EngineBuilt", "CacheHit", "CacheClaimMissing", "BuildFailed", "BuildUnschedulable", "Building",
    # Available
    "ScaledToZero", "EngineNotReady", "MinimumReplicasAvailable", "PodsUnschedulable", "PodsNotReady",
    # Progressing (also "Building")
    "RollingOut", "ProgressDeadlineExceeded", "Settled", "CanaryRunning",
    # Degraded (also "BuildFailed", "CacheClaimMissing", "PodsUnschedulable")
    "InsufficientGPU", "PodsFailing", "AsExpected", "ApplyFailed", "NameConflict", "ForeignPods",
    "CacheClaimTerminating",  # Progressing is also ApplyFailed or NameConflict when a write failed (reconcile.py)
    # ReleaseContract and MetricsValid (desired/contract.py)
    "ReleaseMismatch", "UnknownRelease", "BackendRemoved", "Matches", "SamplesRejected", "Accepted",
    # ModelTrusted (autotune/trust.py)
    "ModelCalibrated", "ModelDisagrees", "ModelCalibrating",
]


@dataclass(frozen=True)
class Condition:
    """A condition as computed by a pure status function (time is stamped when merged)."""

    type: str
    status: ConditionStatus
    reason: ConditionReason
    message: str


def true(type_: str, reason: ConditionReason, message: str) -> Condition:
    return Condition(type_, "True", reason, message)


def false(type_: str, reason: ConditionReason, message: str) -> Condition:
    return Condition(type_, "False", reason, message)


def merge_conditions(
    existing: tuple[ConditionRecord, ...] | None,
    computed: list[Condition],
    generation: int,
    now: datetime,
    retired: Collection[str] = (),
) -> tuple[ConditionRecord, ...]:
    """Return the new condition list: computed ones replace their type, keeping the transition time
    when the status did not change; conditions of other types are kept (a pass that computes only some, as
    reconcile's ApplyFailed, must not drop the others), except the ``retired`` types: those that no longer
    apply (MetricsValid once autotune is off), which are removed rather than left stale."""
    by_type = {c.type: c for c in existing or ()}
    out = {t: c for t, c in by_type.items() if t not in retired}
    for cond in computed:
        previous = by_type.get(cond.type)
        kept = previous is not None and previous.status == cond.status
        message = cond.message if len(cond.message) <= MESSAGE_LIMIT else cond.message[: MESSAGE_LIMIT - 3] + "..."
        out[cond.type] = ConditionRecord(
            type=cond.type,
            status=cond.status,
            reason=cond.reason,
            message=message,
            observed_generation=generation,
            last_transition_time=previous.last_transition_time if previous is not None and kept else rfc3339(now),
        )
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return tuple(sorted(out.values(), key=lambda c: (order.get(c.type, len(order)), c.type)))
