"""Ownership before every write (issue 22): an engine writes a child only when it does not exist or is the engine's
own; an object of the name that is someone else's is never modified or adopted, and becomes Degraded/NameConflict
and an Event. Against the fake API server of test_reconcile_cache (a create of a taken name answers 409; the watch
cache holds only what the test puts there, as the real one lists only objects labelled managed-by=kvpilot)."""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any

import pytest

from kvpilot.k8s.errors import NameConflict, Transient
from kvpilot.k8s.ownership import refusal
from kvpilot.reconcile import ApplyFailed, reconcile
from tests.unit.helpers import engine
from tests.unit.test_reconcile_cache import NOW, S, RecordingApi, claim, run, succeed


def admin_objects() -> list[dict[str, Any]]:
    """What the administrator made in the namespace, under the names an engine "e1" would render."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "e1", "namespace": "ns", "uid": "admin-svc",
                                                             "labels": {"app": "payments"}},
         "spec": {"selector": {"app": "payments"}, "ports": [{"port": 443}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "e1", "namespace": "ns", "uid": "admin-dep"},
         "spec": {"selector": {"matchLabels": {"app": "payments"}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e1-llm-api", "namespace": "ns",
                                                               "uid": "admin-cm"}, "data": {"k": "v"}},
    ]


def fail_pass(api: RecordingApi, e: Any, status: dict[str, Any], minutes: int = 0) -> ApplyFailed:
    with pytest.raises(ApplyFailed) as info:
        asyncio.run(reconcile(api, e, status, S, None, NOW + timedelta(minutes=minutes), writer=api.writer))
    return info.value


def conditions(status: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (status or {}).get("conditions") or []}


def test_objects_of_the_engines_names_made_by_someone_else_are_never_written() -> None:
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    for obj in admin_objects():
        api.server[(obj["kind"], "ns", obj["metadata"]["name"])] = copy.deepcopy(obj)
    before = copy.deepcopy(api.server)
    e = engine()
    status = fail_pass(api, e, {}).status or {}  # building: only the Service is rendered yet
    conds = conditions(status)
    assert conds["Degraded"]["reason"] == "NameConflict" and "Service ns/e1" in conds["Degraded"]["message"]
    succeed(api, status["build"]["job"])
    failure = fail_pass(api, e, status)  # the engine is built: Deployment and ConfigMap are rendered too
    conds = conditions(failure.status)
    message = conds["Degraded"]["message"]
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "NameConflict"
    assert all(name in message for name in ("Service", "Deployment e1", "ConfigMap ns/e1-llm-api")), message
    assert conds["Progressing"]["status"] == "False" and conds["Progressing"]["reason"] == "NameConflict"
    for key, obj in before.items():
        assert api.server[key] == obj  # byte for byte: no apply, no patch, no owner reference added
    touched = {(verb, kind, name) for verb, kind, name in api.writes if verb in ("apply", "patch")}
    assert not touched & {("apply", o["kind"], o["metadata"]["name"]) for o in admin_objects()}
    assert ("create", "Event", "NameConflict") in api.writes
    assert isinstance(failure.cause, NameConflict)


def test_a_retry_that_meets_the_same_conflict_writes_no_status_and_posts_no_event() -> None:
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    svc = admin_objects()[0]
    api.server[("Service", "ns", "e1")] = svc
    e = engine()
    status = fail_pass(api, e, {}).status or {}
    succeed(api, status["build"]["job"])
    status = fail_pass(api, e, status).status or {}
    status = fail_pass(api, e, status).status or {}  # the plan's own bookkeeping settles (the tuner's note)
    api.writes.clear()
    api.status_patches.clear()
    for minutes in (1, 3, 8):  # retries later on: a condition re-stamped would show a new transition time
        status = fail_pass(api, e, status, minutes).status or {}
    assert api.status_patches == [] and not [w for w in api.writes if w[1] == "Event"]
    assert [w for w in api.writes if w[1] == "Service"] == [("create", "Service", "e1"), ("get", "Service", "e1")] * 3


def test_children_of_a_deleted_engine_of_the_same_name_are_not_adopted() -> None:
    """Until the garbage collector removes them, the children of an engine deleted and re-created under the same
    name are controlled by the old UID (and cached: they carry kvpilot's labels)."""
    old, new = engine(uid="old-uid"), engine(uid="new-uid")
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    run(api, old, {})
    for (kind, ns, name), obj in api.server.items():
        if kind == "Service":
            api.cache.upsert(kind, obj)
    api.writes.clear()
    status = fail_pass(api, new, {}).status or {}
    assert conditions(status)["Degraded"]["reason"] == "NameConflict"
    assert "InferenceEngine e1 of another UID (old-uid" in conditions(status)["Degraded"]["message"]
    assert not [w for w in api.writes if w[1] == "Service"]  # judged from the cache: not even a create


def test_an_own_child_the_cache_missed_is_found_by_its_uid_and_applied_over() -> None:
    """A child of this engine that lost its managed-by label (so the watch cache does not list it): the create
    finds the name taken, the read finds the engine's controller reference, and the apply (guarded by the
    object's UID) restores it."""
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    e = engine()
    run(api, e, {})
    svc = api.server[("Service", "ns", "e1")]
    api.cache.delete("Service", svc)
    svc["metadata"]["labels"] = {}
    api.writes.clear()
    run(api, e, {})
    assert [w for w in api.writes if w[1] == "Service"] == [("create", "Service", "e1"), ("get", "Service", "e1"),
                                                            ("apply", "Service", "e1")]
    assert api.server[("Service", "ns", "e1")]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvpilot"


def test_an_object_replaced_since_it_was_cached_is_refused_and_judged_again() -> None:
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    e = engine()
    status = run(api, e, {})
    cached = copy.deepcopy(api.cache.get("Service", "ns", "e1"))
    cached["spec"]["ports"] = [{"port": 1}]  # an edit the next pass would restore ...
    api.cache.upsert("Service", cached)
    api.server[("Service", "ns", "e1")] = admin_objects()[0]  # ... but the object was replaced meanwhile
    failure = fail_pass(api, e, status)
    assert isinstance(failure.failures[0][1], Transient) and "replaced since it was read" in str(failure)
    assert api.cache.get("Service", "ns", "e1") is None
    assert api.server[("Service", "ns", "e1")] == admin_objects()[0]
    second = fail_pass(api, e, failure.status or {})
    assert conditions(second.status)["Degraded"]["reason"] == "NameConflict"


def test_a_claim_of_the_name_the_engine_would_create_that_kvpilot_did_not_make_is_not_written() -> None:
    api = RecordingApi()
    users = {**claim("users-claim"), "metadata": {**claim("users-claim")["metadata"], "name": "e1-engines"}}
    api.cache.upsert("PersistentVolumeClaim", users)  # claims are watched whatever their labels
    api.server[("PersistentVolumeClaim", "ns", "e1-engines")] = users
    e = engine(engineCache={"size": "10Gi"})
    status = fail_pass(api, e, {}).status or {}
    assert "PersistentVolumeClaim ns/e1-engines" in conditions(status)["Degraded"]["message"]
    assert not [w for w in api.writes if w[1] == "PersistentVolumeClaim"]


def test_a_job_of_the_build_name_that_is_not_kvpilots_build_job_is_not_joined() -> None:
    from tests.unit.test_reconcile_cache import rendered_job

    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    job = rendered_job(engine())
    job["metadata"]["labels"] = {"app": "batch"}
    job["metadata"]["ownerReferences"] = []
    api.server[("Job", "ns", job["metadata"]["name"])] = copy.deepcopy(job)
    status = fail_pass(api, engine(), {}).status or {}
    assert conditions(status)["Degraded"]["reason"] == "NameConflict"
    assert "label app.kubernetes.io/managed-by" in conditions(status)["Degraded"]["message"]
    assert not [w for w in api.writes if w == ("patch", "Job", job["metadata"]["name"])]
    assert api.server[("Job", "ns", job["metadata"]["name"])] == job


def _obj(refs: list[dict[str, Any]] | None = None, **labels: str) -> dict[str, Any]:
    return {"kind": "X", "metadata": {"name": "n", "labels": labels, "ownerReferences": refs or []}}


ENGINE_REF = {"apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine", "name": "e1"}
KVPILOT = {"app.kubernetes.io/managed-by": "kvpilot", "app.kubernetes.io/component": "build"}


@pytest.mark.parametrize("live,allowed", [
    (_obj([{**ENGINE_REF, "uid": "me", "controller": True}]), True),
    (_obj([{**ENGINE_REF, "uid": "other", "controller": True}]), False),
    (_obj([{**ENGINE_REF, "uid": "me", "controller": False}]), False),  # an owner, not the controller
    (_obj([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "uid": "me", "controller": True}]), False),
    (_obj(), False),
])
def test_a_controlled_child_is_the_engines_only_by_its_controller_reference(live: dict[str, Any],
                                                                           allowed: bool) -> None:
    desired = _obj([{**ENGINE_REF, "uid": "me", "controller": True}])
    assert (refusal(desired, live, "me") is None) is allowed


@pytest.mark.parametrize("live,allowed", [
    (_obj([{**ENGINE_REF, "uid": "a"}, {**ENGINE_REF, "uid": "b"}], **KVPILOT), True),
    (_obj(**KVPILOT), True),
    (_obj([{**ENGINE_REF, "uid": "a", "controller": True}], **KVPILOT), True),  # an earlier kvpilot's claim
    (_obj([{"apiVersion": "v1", "kind": "Pod", "uid": "p"}], **KVPILOT), False),
    (_obj(**{**KVPILOT, "app.kubernetes.io/component": "server"}), False),
    (_obj(), False),  # the name alone
])
def test_a_shared_object_is_kvpilots_by_its_owners_and_labels(live: dict[str, Any], allowed: bool) -> None:
    desired = _obj([{**ENGINE_REF, "uid": "me", "controller": False}], **KVPILOT)
    assert (refusal(desired, live, "me") is None) is allowed
