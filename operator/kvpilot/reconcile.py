"""One reconcile pass with injected I/O: observe -> plan (pure) -> apply -> record the build -> status.

Nothing here decides anything; it carries out the plan. The same pass runs on create, resume, update and
on a timer, so it must be idempotent: applying an unchanged plan changes nothing.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from kvpilot import telemetry
from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.validate import InvalidEngineError, validate_manifest
from kvpilot.desired import labels as L
from kvpilot.desired.observed import KvWindow, Observed
from kvpilot.desired.plan import Plan, Settings, plan
from kvpilot.desired.storage import engine_index
from kvpilot.k8s.api import Api
from kvpilot.api.conditions import DEGRADED, Condition, merge_conditions
from kvpilot.k8s.errors import ApiError, Conflict
from kvpilot.observe.cluster import observe_engine

log = logging.getLogger(__name__)


def engine_from_body(body: dict[str, Any]) -> InferenceEngine:
    """Parse an InferenceEngine as stored (admission already validated it; defaults are re-applied so a
    field added by a newer CRD still has its value when an older object is read)."""
    manifest = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    defaulted, errors = validate_manifest(manifest, spec_openapi())
    meta = body.get("metadata") or {}
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


async def _ensure_build_job(api: Api, engine: InferenceEngine, job: dict[str, Any]) -> bool:
    """Create the Job, or join it as an owner if another engine with the same inputs created it first."""
    try:
        await api.create(job)
        return True
    except Conflict:
        await _adopt_job(api, engine, job["metadata"]["name"])
        return False


async def _adopt_job(api: Api, engine: InferenceEngine, name: str) -> None:
    ref = L.owner_reference(engine.meta, controller=False)
    # ownerReferences merge by uid under a strategic-merge patch: this adds one owner, keeps the others.
    await api.strategic_patch("batch/v1", "Job", name, engine.meta.namespace, {"metadata": {"ownerReferences": [ref]}})


async def _record_engine(api: Api, namespace: str, claim: str, fingerprint: str, manifest: dict[str, Any]) -> None:
    index = engine_index(namespace, claim)
    try:
        await api.create(index)
    except Conflict:
        pass
    patch = {"data": {fingerprint: json.dumps(manifest, sort_keys=True)}}
    await api.merge_patch("v1", "ConfigMap", index["metadata"]["name"], namespace, patch)


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


async def reconcile(
    api: Api, engine: InferenceEngine, status: dict[str, Any], settings: Settings, kv: KvWindow | None,
    now: datetime | None = None,
) -> tuple[Plan, Observed]:
    """One pass for ``engine`` whose stored status is ``status``; returns the plan and what was observed."""
    started = time.monotonic()
    observed = await observe_engine(api, engine, status, settings, kv)
    p = plan(engine, observed, settings, now or datetime.now(timezone.utc))
    failed: list[tuple[dict[str, Any], ApiError]] = []
    for obj in p.apply:
        try:
            await api.apply(obj)
        except ApiError as exc:  # say so in status (a rendering bug, an immutable field), then retry later
            failed.append((obj, exc))
    if failed:
        obj, exc = failed[0]
        what = f"{obj['kind']} {obj['metadata']['name']}"
        cond = Condition(DEGRADED, "True", "ApplyFailed", f"Could not apply {what}: {exc}")
        p.status["conditions"] = merge_conditions(p.status["conditions"], [cond], engine.meta.generation,
                                                  now or datetime.now(timezone.utc))
    if p.build_job is not None:
        if await _ensure_build_job(api, engine, p.build_job):
            telemetry.BUILDS.labels(outcome="started").inc()
    elif observed.job is not None and engine.meta.uid not in observed.job.owner_uids:
        await _adopt_job(api, engine, observed.job.name)
    if p.index_entry is not None:
        claim, fp, manifest = p.index_entry
        await _record_engine(api, engine.meta.namespace, claim, fp, manifest)
        telemetry.record_build_finished(manifest, observed.job)
    patch = status_patch(status, p.status)
    if patch:
        await api.patch_engine_status(engine.meta.name, engine.meta.namespace, patch)
    involved = {"metadata": {"name": engine.meta.name, "namespace": engine.meta.namespace, "uid": engine.meta.uid}}
    for event in p.events:
        try:
            await api.post_event(involved, event.type, event.reason, event.message)
        except Exception as exc:  # noqa: BLE001 — an event lost must not fail the reconcile
            log.warning("Could not post Event %s for InferenceEngine %s: %s", event.reason, engine.meta.name, exc)
    telemetry.record_plan(engine, p, observed, time.monotonic() - started)
    if failed:
        raise failed[0][1]
    return p, observed
