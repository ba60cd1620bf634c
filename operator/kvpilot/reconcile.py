"""One reconcile pass with injected I/O: observe -> plan (pure) -> apply -> record the build -> status.

Nothing here decides anything; it carries out the plan, through the operator's write layer (``k8s/writes.py``,
which holds what the passes share: shared Jobs being created, writes still in flight); this module keeps no
state of its own. The same pass runs on create, resume, update and
on a timer, so it must be idempotent: applying an unchanged plan changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from kvpilot import telemetry
from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.status import EngineStatus, parse_status, status_dict
from kvpilot.api.validate import InvalidEngineError, validate_manifest
from kvpilot.desired import labels as L
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import JobState, Observed
from kvpilot.desired.build import RETRY_ANNOTATION
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.events import Event, events_between
from kvpilot.desired.once import CreateOnce
from kvpilot.desired.storage import engine_index_entry
from kvpilot.k8s.api import Api
from kvpilot.api.conditions import DEGRADED, PROGRESSING, Condition, ConditionReason, merge_conditions
from kvpilot.api.timestamps import rfc3339
from kvpilot.k8s.errors import PERMANENT_ERRORS, ApiError, NameConflict
from kvpilot.k8s.writes import ChildWriter, Write, build_job_identity
from kvpilot.observe.cluster import observe_engine
from kvpilot.planning import Planner

log = logging.getLogger(__name__)


@functools.cache
def _engine_schema() -> dict[str, Any]:
    """The CRD's schema, built once (not once per engine per restart: docs/scale.md); only read."""
    return spec_openapi()


def engine_from_body(body: dict[str, Any], status: EngineStatus) -> InferenceEngine:
    """Parse an InferenceEngine as stored (admission already validated it; defaults are re-applied so a
    field added by a newer CRD still has its value when an older object is read). ``status`` is the body's
    status, parsed by the caller (which keeps it: status is parsed once per stored version)."""
    manifest = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    meta = body.get("metadata") or {}
    # A generation this operator already reconciled (its status says so) passed these CEL rules then, and the
    # API server enforced them at admission: re-evaluating them on every restart was a large share of the
    # restart settle time (docs/scale.md). Unchanged objects are not re-judged by newer rules,
    # as the API server's validation ratcheting does not re-judge unchanged fields. Types, enums, bounds and
    # patterns are still checked, and defaults applied.
    observed = status.observed_generation
    already_reconciled = observed is not None and observed == meta.get("generation")
    defaulted, errors = validate_manifest(manifest, _engine_schema(), cel=not already_reconciled)
    if errors:
        raise InvalidEngineError(meta.get("name", "?"), errors)
    ref = ObjectRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        labels=dict(meta.get("labels") or {}),
        annotations={k: str(v) for k, v in (meta.get("annotations") or {}).items() if k == RETRY_ANNOTATION},
    )
    return InferenceEngine(meta=ref, spec=parse_spec(defaulted["spec"]))


async def _start_build(writer: ChildWriter, owner: ObjectRef, job: dict[str, Any]) -> None:
    if await writer.start_build(owner, job):
        telemetry.BUILDS.labels(outcome="started").inc()


async def _record_engine(
    writer: ChildWriter, owner: ObjectRef, claim: str, claim_uid: str, fingerprint: str, manifest: dict[str, Any],
    job: JobState | None = None,
) -> None:
    """Publish one engine: its own index ConfigMap, applied (idempotent: no create race, no 409)."""
    await writer.apply(owner, engine_index_entry(owner.namespace, claim, claim_uid, fingerprint, manifest))
    telemetry.record_build_finished(manifest, job)


async def _apply(writer: ChildWriter, owner: ObjectRef, obj: dict[str, Any]) -> None:
    await writer.apply(owner, obj)


def stamp_transitions(old: EngineStatus, new: EngineStatus, when: datetime) -> EngineStatus:
    """Stamp the conditions that moved with the time the status is written, not the time the pass began
    (the applies in between can take many seconds on a loaded API server: docs/scale.md)."""
    before = {c.type: c.last_transition_time for c in old.conditions or ()}
    stamp = rfc3339(when)
    conds = tuple(replace(c, last_transition_time=stamp) if c.last_transition_time != before.get(c.type) else c
                  for c in new.conditions or ())
    return replace(new, conditions=conds)


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning ``old`` into ``new``: keys the plan no longer writes become null (a merge
    patch would otherwise keep them forever, e.g. a TensorRT engine's ceiling after a switch to pytorch)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = status_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch


class ApplyFailed(ApiError):
    """Some writes of a pass failed; status already says which (Degraded, ApplyFailed or NameConflict). ``cause``
    decides how long the loop backs off: the first failure the API server would repeat (PERMANENT_ERRORS) when
    there is one, so one write that cannot succeed backs the engine off even beside a transient failure; else
    the first failure."""

    def __init__(self, failures: list[tuple[str, ApiError]], status: dict[str, Any] | None = None,
                 typed: EngineStatus | None = None):
        self.failures = failures
        self.status = status  # the status written (with the Degraded condition)
        self.typed = typed  # the same, typed
        permanent = [exc for _what, exc in failures if isinstance(exc, PERMANENT_ERRORS)]
        self.cause = permanent[0] if permanent else failures[0][1]
        super().__init__("; ".join(f"{what}: {exc}" for what, exc in failures))


async def _create_once(writer: ChildWriter, owner: ObjectRef, once: CreateOnce) -> None:
    await writer.create_once(owner, once)


def _named_as_decided(job: dict[str, Any] | None, status: EngineStatus) -> dict[str, Any] | None:
    """The build Job under the name the build decision gave it (status.build.job): a retry the user asked for
    builds under a name of its own (desired/build.py, ``retry_job_name``), the failed Job staying as it is."""
    name = status.build.job if status.build is not None else None
    if job is None or not name or job["metadata"]["name"] == name:
        return job
    return {**job, "metadata": {**job["metadata"], "name": name}}


def _pass_writes(writer: ChildWriter, engine: InferenceEngine, p: Plan, observed: Observed) -> list[Write]:
    """The writes of a pass, not yet sent: the plan's applies, the build Job (create or join) and the index entry.

    They do not depend on one another (a pod waits for a ConfigMap it mounts), so they go out together: one
    round trip instead of up to five in a row (serial writes bounded a fleet's rollout on a loaded API server:
    docs/scale.md)."""
    owner = engine.meta
    writes: list[Write] = [(f"{obj['kind']} {obj['metadata']['name']}", _apply(writer, owner, obj)) for obj in p.apply]
    writes += [(str(once), _create_once(writer, owner, once)) for once in p.create_once]
    job = _named_as_decided(p.build_job, p.status)
    job_name = (job or {}).get("metadata", {}).get("name") or (observed.job.name if observed.job else "")
    if job is not None and observed.claim_uid:  # else: the claim's watch event wakes us
        writes.append((f"Job {job_name}", _start_build(writer, owner, job)))
    elif observed.job is not None and owner.uid not in observed.job.owner_uids:
        writes.append((f"Job {job_name}", writer.join_build(
            owner, build_job_identity(owner.namespace, observed.job.name, p.fingerprint))))
    if p.index_entry is not None and observed.claim_uid:
        claim, fp, manifest = p.index_entry
        writes.append((f"ConfigMap {L.engine_index_entry_name(claim, fp)}",
                       _record_engine(writer, owner, claim, observed.claim_uid, fp, manifest, observed.job)))
    return writes


RETRY_NOTE = "kvpilot retries with a growing back-off (at most 10 minutes), and at once when the spec changes"


def _failure_conditions(failed: list[tuple[str, ApiError]]) -> list[Condition]:
    """Degraded=True naming the first failed write (a name taken by a foreign object first: NameConflict, every
    such object named), and Progressing=False: the spec is not applied, whatever the plan saw moving."""
    conflicts = [exc for _what, exc in failed if isinstance(exc, NameConflict)]
    if conflicts:
        reason: ConditionReason = "NameConflict"
        also = "; also taken: " + ", ".join(f"{c.kind} {c.name}" for c in conflicts[1:]) if len(conflicts) > 1 else ""
        message = f"{conflicts[0]}{also}"
    else:
        what, error = failed[0]
        reason = "ApplyFailed"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        message = f"Could not apply {what}: {error}{more}"
    return [Condition(DEGRADED, "True", reason, f"{message}. {RETRY_NOTE}"),
            Condition(PROGRESSING, "False", reason, f"The spec is not applied: {message}")]


def _with_failures(status: EngineStatus, stored: EngineStatus, failed: list[tuple[str, ApiError]], generation: int,
                   now: datetime) -> EngineStatus:
    """``status`` with the failure conditions; their transition times are judged against the stored status (not
    against the plan's fresh conditions, which say no failure), so a retry that fails the same way writes
    nothing. Progressing keeps a build under way ("Building" is still true while a write fails)."""
    progressing = status.condition(PROGRESSING)
    conds = [c for c in _failure_conditions(failed)
             if not (c.type == PROGRESSING and progressing is not None and progressing.reason == "Building")]
    merged = merge_conditions(status.conditions, conds, generation, now)
    before = {c.type: c for c in stored.conditions or ()}
    touched = {c.type for c in conds}
    kept = tuple(replace(c, last_transition_time=before[c.type].last_transition_time)
                 if c.type in touched and c.type in before and before[c.type].status == c.status else c
                 for c in merged)
    return replace(status, conditions=kept)


async def _post_events(api: Api, engine: InferenceEngine, events: list[Event]) -> None:
    """Post the pass's Events at once; one that is lost is logged, and never fails the pass."""
    involved = {"metadata": {"name": engine.meta.name, "namespace": engine.meta.namespace, "uid": engine.meta.uid}}
    posted = await asyncio.gather(*(api.post_event(involved, e.type, e.reason, e.message) for e in events),
                                  return_exceptions=True)
    for event, outcome in zip(events, posted):
        if isinstance(outcome, Exception):
            log.warning("Could not post Event %s for InferenceEngine %s: %s", event.reason, engine.meta.name,
                        outcome)
        elif isinstance(outcome, BaseException):
            raise outcome


async def reconcile(
    api: Api, engine: InferenceEngine, status: dict[str, Any], settings: Settings, kv: KvWindow | None,
    now: datetime | None = None, planner: Planner | None = None, typed: EngineStatus | None = None, *,
    writer: ChildWriter, canary_kv: tuple[KvWindow | None, KvWindow | None] = (None, None),
) -> tuple[Plan, Observed]:
    """One pass for ``engine`` whose stored status is ``status`` (``typed``: its parse, when the caller keeps
    one; else it is parsed here, once); returns the plan and what was observed. ``writer`` is the operator's
    one write layer (over ``api``): it sends the children's writes. ``canary_kv``: the windows of a canary pod
    and of the other pods, while one runs (autotune/canary.py).

    Reads come from the watch cache; a child is written only when it differs from the plan on what kvpilot
    owns. Every failed write reaches status (Degraded, naming the object and the reason) before the pass
    raises, whatever write failed."""
    started = time.monotonic()
    stored = typed if typed is not None else parse_status(status)
    at = now or datetime.now(timezone.utc)
    observed = observe_engine(api.cache, engine, stored, settings, kv, api.gpus, at, canary_kv)
    # A plan that may run the tuner's what-if simulation runs off the event loop, within a CPU budget.
    p = await planner.plan(engine, observed, settings, at) if planner else plan(engine, observed, settings, at)
    ns = engine.meta.namespace
    failed = await writer.write_all(ns, _pass_writes(writer, engine, p, observed))
    written_at = now or datetime.now(timezone.utc)
    new_status = (_with_failures(p.status, observed.status, failed, engine.meta.generation, written_at)
                  if failed else p.status)
    new_status = stamp_transitions(observed.status, new_status, written_at)
    written = status_dict(new_status)  # the one serialization of the pass
    p = replace(p, status=new_status, written=written)
    patch = status_patch(status, written)
    if patch:
        await api.patch_engine_status(engine.meta.name, ns, patch)
    await _post_events(api, engine, list(events_between(observed.status, new_status) if failed else p.events))
    telemetry.record_plan(engine, p, observed, time.monotonic() - started)
    if failed:
        raise ApplyFailed(failed, written, new_status)
    return p, observed
