"""The runtime max_batch_size in force, and the autotuner's decision folded into status.

The value lives in ``status.batching`` (never in spec: a GitOps tool owns spec). A tuned value survives
while tuning applies (autotune enabled, mode Auto) and until the user changes ``spec.batching.maxBatchSize``,
which resets the tuner to the new starting point. Its provenance (``source``) is kept apart from the reason,
so a tuned value clamped to a lower engine ceiling stays tuned.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kvpilot.api.conditions import rfc3339
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.enums import MAX_BATCH
from kvpilot.api.status_schema import HISTORY_LIMIT
from kvpilot.autotune.policy import MIN_RELATIVE_STEP, WHAT_IF_RECHECK_SECONDS, Decision

TUNED = "Autotune"  # status.batching.source of a value the tuner set


def tuning_applies(spec: InferenceEngineSpec) -> bool:
    return spec.autotune.enabled and spec.autotune.mode == "Auto"


def value_in_force(spec: InferenceEngineSpec, previous: dict[str, Any], ceiling: int | None) -> tuple[int, str, str]:
    """(value, reason, message) before this interval's decision."""
    spec_value = spec.batching.max_batch_size
    if (
        tuning_applies(spec)
        and previous.get("source") == TUNED
        and previous.get("specValue") == spec_value
        and previous.get("maxBatchSize")
    ):
        value, reason, message = int(previous["maxBatchSize"]), previous["reason"], previous.get("message", "")
    else:
        value, reason, message = spec_value, "SpecValue", "spec.batching.maxBatchSize"
    limit = ceiling if ceiling is not None else MAX_BATCH
    if value > limit:
        return limit, "EngineCeiling", f"{value} exceeds the engine's ceiling {limit}"
    return value, reason, message


def batching_status(
    spec: InferenceEngineSpec, previous: dict[str, Any], value: int, reason: str, message: str,
    ceiling: int | None, now: datetime,
) -> dict[str, Any]:
    changed = previous.get("maxBatchSize") != value
    tuned = reason.startswith("Autotune") or (reason == "EngineCeiling" and previous.get("source") == TUNED)
    return {
        "source": TUNED if tuned else "Spec",
        "maxBatchSize": value,
        "reason": reason,
        "message": message[:1024],
        "changedAt": rfc3339(now) if changed or not previous.get("changedAt") else previous["changedAt"],
        "summary": f"{value}/{ceiling}" if ceiling is not None else str(value),
        "specValue": spec.batching.max_batch_size,
    }


def decision_record(decision: Decision, current: int, applied: bool, now: datetime) -> dict[str, Any]:
    return {
        "at": rfc3339(now),
        "action": decision.action,
        "fromBatchSize": current,
        "toBatchSize": decision.ceiling_request if decision.action == "Rebuild" else decision.target,
        "reason": decision.reason,
        "message": decision.message[:1024],
        "applied": applied,
    }


def _simulated(previous: dict[str, Any], now: datetime) -> bool:
    """Whether a NoPredictedGain decision now came from a simulation that ran (not from the policy skipping it
    within WHAT_IF_RECHECK_SECONDS of the last decline)."""
    at = previous.get("whatIfDeclinedAt")
    if not isinstance(at, str):
        return True
    try:
        then = datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    except ValueError:
        return True
    return (now - then).total_seconds() >= WHAT_IF_RECHECK_SECONDS


def autotune_status(
    previous: dict[str, Any], decision: Decision | None, current: int, applied: bool, now: datetime,
    spec_ceiling: int = 0,
) -> dict[str, Any]:
    """Recommendation (refreshed only when it changes, to keep status writes rare) and bounded history."""
    out = dict(previous)
    if decision is None:
        return out
    record = decision_record(decision, current, applied, now)
    old = previous.get("recommendation") or {}
    same = all(old.get(k) == record[k] for k in ("action", "reason", "applied", "fromBatchSize"))
    if same and not applied:
        # The same advice with a target that jitters window to window is not news (no Event, no history).
        moved = abs((record["toBatchSize"] or 0) - (old.get("toBatchSize") or 0))
        same = moved < MIN_RELATIVE_STEP * max(1, old.get("toBatchSize") or 1)
    if not same:
        out["recommendation"] = record
        if decision.changes:
            out["history"] = ([record] + list(previous.get("history") or []))[:HISTORY_LIMIT]
    if decision.reason == "NoPredictedGain" and _simulated(previous, now):
        out["whatIfDeclinedAt"] = rfc3339(now)  # the policy reruns the simulation only a period later
    if applied:
        out.pop("whatIfDeclinedAt", None)
        out["lastAppliedAt"] = rfc3339(now)
        if decision.action == "Rebuild" and decision.ceiling_request:
            out["ceilingRequest"] = decision.ceiling_request
            out["ceilingRequestFrom"] = spec_ceiling
    return out
