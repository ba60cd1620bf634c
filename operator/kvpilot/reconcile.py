"""One reconcile pass with injected I/O: observe -> plan (pure) -> apply -> record the build -> status.

Nothing here decides anything; it carries out the plan. The same pass runs on create, resume, update and
on a timer, so it must be idempotent: applying an unchanged plan changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from collections.abc import Awaitable
from typing import Any

from kvpilot import telemetry
from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.status import EngineStatus, parse_status, status_dict
from kvpilot.api.validate import InvalidEngineError, validate_manifest
from kvpilot.desired import labels as L
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import JobState, Observed
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.events import events_between
from kvpilot.desired.storage import engine_index_entry
from kvpilot.k8s.api import Api
from kvpilot.api.conditions import DEGRADED, Condition, merge_conditions
from kvpilot.api.timestamps import rfc3339
from kvpilot.k8s.errors import ApiError, Conflict
from kvpilot.observe.cluster import observe_engine
from kvpilot.planning import Planner

log = logging.getLogger(__name__)


@functools.cache
def _engine_schema() -> dict[str, Any]:
    """The CRD's schema, built once (building it is ~1 ms, once per engine per restart otherwise); only read."""
    return spec_openapi()


def engine_from_body(body: dict[str, Any], status: EngineStatus) -> InferenceEngine:
    """Parse an InferenceEngine as stored (admission already validated it; defaults are re-applied so a
    field added by a newer CRD still has its value when an older object is read). ``status`` is the body's
    status, parsed by the caller (which keeps it: status is parsed once per stored version)."""
    manifest = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    meta = body.get("metadata") or {}
    # A generation this operator already reconciled (its status says so) passed these CEL rules then, and the
    # API server enforced them at admission: re-evaluating them on every restart cost ~10 ms per engine (a
    # third of the restart settle time at 1,000 engines). Unchanged objects are not re-judged by newer rules,
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
    )
    return InferenceEngine(meta=ref, spec=parse_spec(defaulted["spec"]))


# Build Jobs being created right now, by (namespace, name): engines sharing a fingerprint join the first
# engine's create instead of racing it (which cost 500 409s and 900 adopt patches at 1,000 engines).
_creating: dict[tuple[str, str], asyncio.Future[None]] = {}


async def _ensure_build_job(api: Api, engine: InferenceEngine, job: dict[str, Any]) -> bool:
    """Create the Job, or join it as an owner if another engine with the same inputs created it first."""
    key = (job["metadata"]["namespace"], job["metadata"]["name"])
    cached = api.cache.get("Job", *key)
    if cached is not None:  # another engine created it since this pass observed
        if engine.meta.uid not in {r.get("uid") for r in cached["metadata"].get("ownerReferences") or []}:
            await _adopt_job(api, engine, key[1])
        return False
    pending = _creating.get(key)
    if pending is not None:
        await asyncio.shield(pending)
        await _adopt_job(api, engine, key[1])
        return False
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _creating[key] = done
    try:
        api.cache.upsert("Job", await api.create(job))
        return True
    except Conflict:  # created before this operator started, and not yet in its cache
        await _adopt_job(api, engine, key[1])
        return False
    finally:
        done.set_result(None)
        del _creating[key]


async def _adopt_job(api: Api, engine: InferenceEngine, name: str) -> None:
    ref = L.owner_reference(engine.meta, controller=False)
    # ownerReferences merge by uid under a strategic-merge patch: this adds one owner, keeps the others.
    out = await api.strategic_patch("batch/v1", "Job", name, engine.meta.namespace,
                                    {"metadata": {"ownerReferences": [ref]}})
    api.cache.upsert("Job", out)


async def _record_engine(
    api: Api, namespace: str, claim: str, claim_uid: str, fingerprint: str, manifest: dict[str, Any],
    job: JobState | None = None,
) -> None:
    """Publish one engine: its own index ConfigMap, applied (idempotent: no create race, no 409)."""
    await api.apply_owned(engine_index_entry(namespace, claim, claim_uid, fingerprint, manifest))
    telemetry.record_build_finished(manifest, job)


# A pass waits this long (half a second) for its writes; one still in flight then completes in the background, and its outcome
# (a failure) reaches the next pass of the engine. Creating a Service took 3.4 s at 1,000 engines (the API server
# allocates ClusterIPs one at a time): a pass holding its reconcile slot for that long kept the engines whose
# pods had become ready queued behind Service creations.
WRITE_WAIT_SECONDS = 0.5
# Writes still in flight after their pass moved on, and the failures they ended in, by (namespace, "Kind name").
_in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}
_late_failures: dict[tuple[str, str], ApiError] = {}


async def _write_all(namespace: str, writes: list[tuple[str, Awaitable[None]]]) -> list[tuple[str, ApiError]]:
    """Send a pass's writes at once; the failures among those that ended within WRITE_WAIT_SECONDS, and those
    of earlier writes that ended in the background. A write of an object still in flight is not sent again."""
    failed: list[tuple[str, ApiError]] = []
    tasks: dict[str, asyncio.Task[None]] = {}
    for what, write in writes:
        key = (namespace, what)
        late = _late_failures.pop(key, None)
        if late is not None:
            failed.append((what, late))
        running = _in_flight.get(key)
        if running is not None and not running.done():
            if asyncio.iscoroutine(write):
                write.close()  # not sent: the same object is still being written
            continue
        tasks[what] = asyncio.ensure_future(write)
    if tasks:
        await asyncio.wait(tasks.values(), timeout=WRITE_WAIT_SECONDS)
    for what, task in tasks.items():
        key = (namespace, what)
        if not task.done():
            _in_flight[key] = task
            task.add_done_callback(functools.partial(_landed, key))
            continue
        exc = task.exception()
        if isinstance(exc, ApiError):  # say so in status (a rendering bug, an immutable field), then retry
            failed.append((what, exc))
        elif exc is not None:
            raise exc
    return failed


def _landed(key: tuple[str, str], task: asyncio.Task[None]) -> None:
    """A write that outlived its pass ended: keep its failure for the engine's next pass."""
    if _in_flight.get(key) is task:
        del _in_flight[key]
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, ApiError):
        _late_failures[key] = exc
    elif exc is not None:
        log.error("Write of %s in namespace %s failed: %s", key[1], key[0], exc)


async def _apply(api: Api, obj: dict[str, Any]) -> None:
    await api.apply_owned(obj)


async def _start_build(api: Api, engine: InferenceEngine, job: dict[str, Any]) -> None:
    if await _ensure_build_job(api, engine, job):
        telemetry.BUILDS.labels(outcome="started").inc()


def stamp_transitions(old: EngineStatus, new: EngineStatus, when: datetime) -> EngineStatus:
    """Stamp the conditions that moved with the time the status is written, not the time the pass began
    (applies in between took up to 38 s at 1,000 engines)."""
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
    """Some writes of a pass failed; status already says which (Degraded/ApplyFailed). ``cause`` is the first
    failure, whose type (Forbidden, Invalid, Transient) decides how long the loop backs off."""

    def __init__(self, failures: list[tuple[str, ApiError]], status: dict[str, Any] | None = None,
                 typed: EngineStatus | None = None):
        self.failures = failures
        self.status = status  # the status written (with the Degraded condition)
        self.typed = typed  # the same, typed
        self.cause = failures[0][1]
        super().__init__("; ".join(f"{what}: {exc}" for what, exc in failures))


async def reconcile(
    api: Api, engine: InferenceEngine, status: dict[str, Any], settings: Settings, kv: KvWindow | None,
    now: datetime | None = None, planner: Planner | None = None, typed: EngineStatus | None = None,
) -> tuple[Plan, Observed]:
    """One pass for ``engine`` whose stored status is ``status`` (``typed``: its parse, when the caller keeps
    one; else it is parsed here, once); returns the plan and what was observed.

    Reads come from the watch cache; a child is written only when it differs from the plan on what kvpilot
    owns. Every failed write reaches status (Degraded, naming the object and the reason) before the pass
    raises, whatever write failed."""
    started = time.monotonic()
    stored = typed if typed is not None else parse_status(status)
    observed = observe_engine(api.cache, engine, stored, settings, kv, api.gpus)
    at = now or datetime.now(timezone.utc)
    # A plan that may run the tuner's what-if simulation runs off the event loop, within a CPU budget.
    p = await planner.plan(engine, observed, settings, at) if planner else plan(engine, observed, settings, at)
    ns = engine.meta.namespace
    # The writes of a pass do not depend on one another (a pod waits for a ConfigMap it mounts), so they go out
    # together: one round trip instead of up to five in a row. At 1,000 engines on a loaded API server each
    # write took ~0.3 s, and serial writes made a pass last 2.5-7.5 s, which bounded the whole rollout.
    writes: list[tuple[str, Awaitable[None]]] = [
        (f"{obj['kind']} {obj['metadata']['name']}", _apply(api, obj)) for obj in p.apply]
    job_name = (p.build_job or {}).get("metadata", {}).get("name") or (observed.job.name if observed.job else "")
    if p.build_job is not None and observed.claim_uid:  # else: the claim's watch event wakes us
        writes.append((f"Job {job_name}", _start_build(api, engine, p.build_job)))
    elif observed.job is not None and engine.meta.uid not in observed.job.owner_uids:
        writes.append((f"Job {job_name}", _adopt_job(api, engine, observed.job.name)))
    if p.index_entry is not None and observed.claim_uid:
        claim, fp, manifest = p.index_entry
        writes.append((f"ConfigMap {L.engine_index_entry_name(claim, fp)}",
                       _record_engine(api, ns, claim, observed.claim_uid, fp, manifest, observed.job)))
    failed = await _write_all(ns, writes)
    new_status = p.status
    if failed:
        what, error = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        cond = Condition(DEGRADED, "True", "ApplyFailed", f"Could not apply {what}: {error}{more}")
        merged = merge_conditions(new_status.conditions, [cond], engine.meta.generation,
                                  now or datetime.now(timezone.utc))
        new_status = replace(new_status, conditions=merged)
    new_status = stamp_transitions(observed.status, new_status, now or datetime.now(timezone.utc))
    written = status_dict(new_status)  # the one serialization of the pass
    p = replace(p, status=new_status, written=written)
    patch = status_patch(status, written)
    if patch:
        await api.patch_engine_status(engine.meta.name, ns, patch)
    involved = {"metadata": {"name": engine.meta.name, "namespace": ns, "uid": engine.meta.uid}}
    events = list(events_between(observed.status, new_status) if failed else p.events)
    posted = await asyncio.gather(*(api.post_event(involved, e.type, e.reason, e.message) for e in events),
                                  return_exceptions=True)
    for event, outcome in zip(events, posted):
        if isinstance(outcome, Exception):  # an event lost must not fail the reconcile
            log.warning("Could not post Event %s for InferenceEngine %s: %s", event.reason, engine.meta.name,
                        outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
    telemetry.record_plan(engine, p, observed, time.monotonic() - started)
    if failed:
        raise ApplyFailed(failed, written, new_status)
    return p, observed
