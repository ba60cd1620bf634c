"""Kubernetes Events derived from what changed between the previous and the new status.

Deriving them from the status diff (rather than emitting them where things happen) keeps them exactly
once per transition, even when a reconcile is repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.api.conditions import DEGRADED
from kvpilot.api.status import (
    Action,
    AutotuneStatus,
    BatchingStatus,
    BuildState,
    BuildStatus,
    CanaryStatus,
    ConditionRecord,
    DecisionRecord,
    EngineStatus,
)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # PascalCase, specific
    message: str


def _build_event(build: BuildStatus) -> Event | None:
    fp, job = (build.fingerprint or "")[:10], build.job
    if build.state == BuildState.BUILDING:
        return Event("Normal", "EngineBuildStarted", f"Job {job} builds engine {fp}")
    if build.state == BuildState.SUCCEEDED:
        return Event("Normal", "EngineBuilt", f"Job {job} published engine {fp}")
    if build.state == BuildState.CACHE_HIT:
        return Event("Normal", "EngineCacheHit", f"Engine {fp} is already in the cache; no build")
    if build.state == BuildState.FAILED:
        return Event("Warning", "EngineBuildFailed", f"Job {job} failed: {(build.message or '')[-512:]}")
    return None


def events_between(old: EngineStatus, new: EngineStatus) -> list[Event]:
    out: list[Event] = []
    ob, nb = old.build or BuildStatus(), new.build
    if nb is not None and (nb.fingerprint, nb.state) != (ob.fingerprint, ob.state):
        if (event := _build_event(nb)) is not None:
            out.append(event)
    oe, ne = (old.engine.fingerprint if old.engine else None), (new.engine.fingerprint if new.engine else None)
    if ne and oe and ne != oe:
        out.append(Event("Normal", "RolloutStarted", f"Rolling out engine {ne[:10]} (was {oe[:10]})"))
    obat, nbat = old.batching or BatchingStatus(), new.batching or BatchingStatus()
    if obat.max_batch_size and nbat.max_batch_size != obat.max_batch_size and nbat.reason == "AutotuneRolledBack":
        # A change the tuner made served measurably worse: a Warning, with both windows' figures (issue 18).
        out.append(Event("Warning", "AutotuneRolledBack", f"Runtime max_batch_size {obat.max_batch_size} -> "
                         f"{nbat.max_batch_size}: {nbat.message or ''}"[:1024]))
    elif obat.max_batch_size and nbat.max_batch_size != obat.max_batch_size:
        out.append(
            Event("Normal", "BatchSizeChanged",
                  f"Runtime max_batch_size {obat.max_batch_size} -> {nbat.max_batch_size} ({nbat.reason}): "
                  f"{nbat.message or ''}"[:1024])
        )
    orec = (old.autotune or AutotuneStatus()).recommendation
    nrec = (new.autotune or AutotuneStatus()).recommendation
    if nrec is not None and nrec != DecisionRecord() and nrec.action != Action.HOLD and not nrec.applied \
            and nrec != orec:
        out.append(Event("Normal", "AutotuneRecommendation",
                         f"Recommend {nrec.action} to {nrec.to_batch_size}: {nrec.message or ''}"[:1024]))
    out += _canary_events(old, new)
    odeg, ndeg = old.condition(DEGRADED), new.condition(DEGRADED)
    if ndeg is not None and ndeg.status == "True" and _status_reason(odeg) != ("True", ndeg.reason):
        if ndeg.reason != "BuildFailed":  # already reported as EngineBuildFailed
            out.append(Event("Warning", ndeg.reason, ndeg.message))
    return out


def _canary_events(old: EngineStatus, new: EngineStatus) -> list[Event]:
    """CanaryStarted, CanaryPromoted, CanaryRolledBack (Warning, with both groups' figures): once per transition
    of status.autotune.canary (autotune/canary.py)."""
    was = (old.autotune or AutotuneStatus()).canary or CanaryStatus()
    now = (new.autotune or AutotuneStatus()).canary or CanaryStatus()
    out: list[Event] = []
    if now.phase == "Running" and (was.phase is None or was.started_at != now.started_at):
        out.append(Event("Normal", "CanaryStarted",
                         f"Trying runtime max_batch_size {now.to_batch_size} on one pod beside the pods at "
                         f"{now.from_batch_size} ({now.reason or 'the tuner'}); the others keep serving"[:1024]))
    if now.outcome is not None and now.decided_at is not None and now.decided_at != was.decided_at:
        kind, reason = {"Promoted": ("Normal", "CanaryPromoted"), "RolledBack": ("Warning", "CanaryRolledBack"),
                        "Abandoned": ("Normal", "CanaryAbandoned")}[now.outcome]
        out.append(Event(kind, reason, f"Canary {now.from_batch_size} -> {now.to_batch_size}: {now.message or ''}"[:1024]))
    return out


def _status_reason(condition: ConditionRecord | None) -> tuple[str | None, str | None]:
    return (condition.status, condition.reason) if condition is not None else (None, None)
