"""The reconcile pass against a fake API boundary: reads come from the watch cache, writes happen only on a
diff, a hand edit or deletion is restored, a re-created claim is not a cache hit, and every failed write
reaches status before the pass raises (issues 12 and 13)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot import loop as loop_module
from kvpilot.desired import labels as L
from kvpilot.desired.settings import Settings
from kvpilot.k8s.api import Api
from kvpilot.k8s.errors import ApiError, Conflict, Forbidden, Invalid, Transient
from kvpilot.k8s.writes import ChildWriter
from kvpilot.reconcile import ApplyFailed, reconcile
from tests.unit.helpers import engine

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
S = Settings()


class FakeApi(Api):
    """The real ``Api`` (its cache) with the wire replaced by a small fake API server: writes are recorded, kept in
    ``server`` and echoed back the way the API server answers them (a resourceVersion, a uid). A create of a name
    ``server`` holds answers 409; an apply carrying a ``metadata.uid`` other than the stored object's is refused
    (422), as the API server refuses it. ``writer`` is a fresh write layer over it, as the operator builds one
    beside its Api: no test sees another's shared Jobs or writes in flight."""

    def __init__(self) -> None:
        super().__init__(api_client=object(), pool_size=1)  # type: ignore[arg-type]
        self.writer = ChildWriter(self)
        self.writes: list[tuple[str, str, str]] = []
        self.fail: dict[tuple[str, str], ApiError] = {}  # (verb, kind) -> error to raise
        self.server: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name) -> object
        self._rv = itertools.count(100)

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
        meta = obj["metadata"]
        return obj["kind"], meta.get("namespace", "ns"), meta.get("name", "")

    def _echo(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        out["metadata"].setdefault("uid", f"uid-{out['metadata']['name']}")
        out["metadata"]["resourceVersion"] = str(next(self._rv))
        self.server[self._key(out)] = copy.deepcopy(out)
        return out

    def _write(self, verb: str, kind: str, name: str) -> None:
        self.writes.append((verb, kind, name))
        if (verb, kind) in self.fail:
            raise self.fail[(verb, kind)]

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._write("apply", obj["kind"], obj["metadata"]["name"])
        live = self.server.get(self._key(obj))
        given = obj["metadata"].get("uid")
        if given and (live is None or live["metadata"].get("uid") != given):
            raise Invalid(f'HTTP 422: {obj["kind"]} is invalid: metadata.uid: Invalid value: "{given}": '
                          "field is immutable")
        return self._echo(obj)

    async def _create(self, verb: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._write(verb, obj["kind"], obj["metadata"].get("name", ""))
        if self._key(obj) in self.server:
            raise Conflict(f'HTTP 409: {obj["kind"]} "{obj["metadata"]["name"]}" already exists')
        return self._echo(obj)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._create("create", obj)

    async def create_applied(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._create("create", obj)

    async def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self._write("get", kind, name)
        live = self.server.get((kind, namespace, name))
        return copy.deepcopy(live) if live is not None else None

    async def strategic_patch(self, api_version: str, kind: str, name: str, namespace: str,
                              patch: dict[str, Any]) -> dict[str, Any]:
        self._write("patch", kind, name)
        live = copy.deepcopy(self.server.get((kind, namespace, name)) or self.cache.get(kind, namespace, name)
                             or {"kind": kind, "metadata": {"name": name, "namespace": namespace}})
        refs = live["metadata"].setdefault("ownerReferences", [])
        refs += [r for r in patch["metadata"]["ownerReferences"] if r["uid"] not in {x["uid"] for x in refs}]
        return self._echo(live)

    async def patch_engine_status(self, name: str, namespace: str, status: dict[str, Any]) -> None:
        self._write("patch", "InferenceEngine/status", name)

    async def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.writes.append(("create", "Event", reason))


class RecordingApi(FakeApi):
    """A FakeApi that also keeps every status patch, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.status_patches: list[dict[str, Any]] = []

    async def patch_engine_status(self, name: str, namespace: str, status: dict[str, Any]) -> None:
        await super().patch_engine_status(name, namespace, status)
        self.status_patches.append(status)


def claim(uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "engines", "namespace": "ns", "uid": uid, "resourceVersion": "1"},
            "spec": {}, "status": {"phase": "Bound"}}


def succeed(api: FakeApi, job_name: str) -> None:
    job = copy.deepcopy(api.cache.get("Job", "ns", job_name))
    job["metadata"]["resourceVersion"] = "900"
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}],
                     "startTime": "2026-11-29T12:00:00Z", "completionTime": "2026-11-29T12:05:00Z"}
    api.cache.upsert("Job", job)


def run(api: FakeApi, e: Any, status: dict[str, Any]) -> dict[str, Any]:
    p, _observed = asyncio.run(reconcile(api, e, status, S, None, NOW, writer=api.writer))
    assert p.written is not None
    return p.written


def serve(api: FakeApi) -> tuple[Any, dict[str, Any]]:
    """An engine taken to serving: build Job created, succeeded, index recorded, Deployment applied."""
    e = engine()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    status = run(api, e, {})
    job = status["build"]["job"]
    assert ("create", "Job", job) in api.writes
    succeed(api, job)
    status = run(api, e, status)
    return e, status


def test_an_unchanged_pass_writes_nothing() -> None:
    api = FakeApi()
    e, status = serve(api)
    assert ("create", "Deployment", "e1") in api.writes and status["build"]["state"] == "Succeeded"
    status = run(api, e, status)  # sees the Deployment it applied: conditions move once
    api.writes.clear()
    for _ in range(3):
        status = run(api, e, status)
    assert api.writes == []


def test_a_child_edited_or_deleted_out_of_band_is_restored() -> None:
    api = FakeApi()
    e, status = serve(api)
    status = run(api, e, status)
    api.writes.clear()
    dep = copy.deepcopy(api.cache.get("Deployment", "ns", "e1"))
    dep["spec"]["replicas"] = 7  # kubectl scale / edit: the hash annotation is unchanged
    dep["metadata"]["resourceVersion"] = "5000"
    api.cache.upsert("Deployment", dep)
    api.cache.delete("Service", {"metadata": {"name": "e1", "namespace": "ns"}})
    del api.server[("Service", "ns", "e1")]
    run(api, e, status)
    assert sorted(api.writes) == [("apply", "Deployment", "e1"), ("create", "Service", "e1")]


def test_an_entry_of_a_recreated_claim_is_no_cache_hit() -> None:
    api = FakeApi()
    e, status = serve(api)
    status = run(api, e, status)
    assert len(api.cache.index_entries("ns", "engines")) == 1
    api.cache.upsert("PersistentVolumeClaim", {**claim("claim-2"), "metadata": {**claim("claim-2")["metadata"],
                                                                                "resourceVersion": "7000"}})
    api.writes.clear()
    other = engine(name="e2", uid="uid-2")  # same build inputs, same claim name: would have been a CacheHit
    new = run(api, other, {})
    assert new["build"]["state"] == "Building"
    assert new["build"]["job"] == L.build_job_name(new["build"]["fingerprint"], "engines", "claim-2")
    assert new["build"]["job"] != status["build"]["job"]
    assert ("create", "Job", new["build"]["job"]) in api.writes


def test_engines_sharing_a_fingerprint_create_one_job_and_no_conflicts() -> None:
    api = FakeApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    engines = [engine(name=f"e{i}", uid=f"u{i}") for i in range(5)]

    async def all_at_once() -> None:
        await asyncio.gather(*(reconcile(api, e, {}, S, None, NOW, writer=api.writer) for e in engines))

    asyncio.run(all_at_once())
    jobs = [w for w in api.writes if w[1] == "Job"]
    assert [w[0] for w in jobs].count("create") == 1
    assert [w[0] for w in jobs].count("patch") == 4  # each other engine joins as an owner, once


def rendered_job(e: Any) -> dict[str, Any]:
    """The build Job a first pass of ``e`` creates (on a fresh fake server with claim-1)."""
    other = FakeApi()
    other.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    status = run(other, e, {})
    return copy.deepcopy(other.server[("Job", "ns", status["build"]["job"])])


def test_a_job_that_already_exists_is_adopted_not_a_failure() -> None:
    """Create answers 409 (the Job was created by another engine before this operator started and is not in its
    cache yet): the engine reads it, finds kvpilot's build Job of its inputs, joins it as an owner and builds on,
    with no Degraded condition and no error."""
    api = FakeApi()
    e = engine()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    job_obj = rendered_job(engine(name="e0", uid="uid-0"))
    api.server[("Job", "ns", job_obj["metadata"]["name"])] = job_obj
    status = run(api, e, {})
    job = status["build"]["job"]
    assert job == job_obj["metadata"]["name"]
    assert [w for w in api.writes if w[1] == "Job"] == [("create", "Job", job), ("get", "Job", job),
                                                        ("patch", "Job", job)]
    owners = [r["uid"] for r in api.cache.get("Job", "ns", job)["metadata"]["ownerReferences"]]
    assert owners == ["uid-0", e.meta.uid] and status["build"]["state"] == "Building"
    assert "Degraded" not in {c["type"] for c in status["conditions"] if c["status"] == "True"}


@pytest.mark.parametrize("verb,kind", [("create", "Deployment"), ("create", "Job"), ("create", "ConfigMap")])
def test_every_failed_write_reaches_status_before_the_pass_raises(verb: str, kind: str) -> None:
    api = FakeApi()
    e = engine()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    status = run(api, e, {})
    if kind != "Job":
        succeed(api, status["build"]["job"])
    else:
        api.cache.delete("Job", {"metadata": {"name": status["build"]["job"], "namespace": "ns"}})
        del api.server[("Job", "ns", status["build"]["job"])]
    api.fail[(verb, kind)] = Invalid("HTTP 422: spec.template: Invalid value")
    api.writes.clear()
    with pytest.raises(ApplyFailed) as info:
        asyncio.run(reconcile(api, e, status, S, None, NOW, writer=api.writer))
    assert ("patch", "InferenceEngine/status", "e1") in api.writes
    conds = {c["type"]: c for c in info.value.status["conditions"]}
    degraded = conds["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "ApplyFailed"
    assert kind in degraded["message"] and "Invalid value" in degraded["message"]
    # Never "Settled" while the spec is not applied (a build under way stays "Building": that is still true).
    assert conds["Progressing"]["reason"] in ("ApplyFailed", "Building"), conds["Progressing"]


def test_errors_a_retry_cannot_fix_back_off_longer() -> None:
    for failures in range(4):
        permanent = loop_module.backoff_seconds(ApplyFailed([("Job x", Forbidden("HTTP 403"))]), failures)
        invalid = loop_module.backoff_seconds(Invalid("HTTP 422"), failures)
        transient = loop_module.backoff_seconds(ApplyFailed([("Job x", Transient("HTTP 500"))]), failures)
        assert permanent > transient and invalid > transient


def test_a_slow_write_does_not_hold_the_pass_and_its_failure_reaches_the_next_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a Service took 3.4 s at 1,000 engines: the pass moves on, the write is not sent twice while
    it is in flight, and its failure is reported by the engine's next pass."""
    api = FakeApi()
    api.writer.wait_seconds = 0.01
    e = engine()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    release: list[asyncio.Future[None]] = []
    fast_create = api.create_applied

    async def slow_service(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Service":
            api.writes.append(("create", "Service", obj["metadata"]["name"]))
            release.append(asyncio.get_running_loop().create_future())
            await release[-1]
            raise Transient("HTTP 504: timeout allocating a ClusterIP")
        return await fast_create(obj)

    monkeypatch.setattr(api, "create_applied", slow_service)

    async def passes() -> None:
        status = (await reconcile(api, e, {}, S, None, NOW, writer=api.writer))[0].written or {}
        succeed(api, status["build"]["job"])
        status = (await reconcile(api, e, status, S, None, NOW, writer=api.writer))[0].written or {}  # Service in flight: it moved on
        assert ("create", "Deployment", "e1") in api.writes and ("patch", "InferenceEngine/status", "e1") in api.writes
        status = (await reconcile(api, e, status, S, None, NOW, writer=api.writer))[0].written or {}
        assert api.writes.count(("create", "Service", "e1")) == 1  # not sent again while in flight
        release[0].set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        with pytest.raises(ApplyFailed) as info:
            await reconcile(api, e, status, S, None, NOW, writer=api.writer)
        degraded = {c["type"]: c for c in info.value.status["conditions"]}["Degraded"]
        assert degraded["reason"] == "ApplyFailed" and "Service e1" in degraded["message"]
        release[-1].set_result(None)  # the retry that pass sent

    asyncio.run(passes())


def test_the_write_state_belongs_to_one_writer() -> None:
    """A late failure kept by one operator's write layer reaches that operator's next pass, never a pass of
    another (it did, as a process global: a failed Service write of one test failed a later test's pass)."""
    async def passes() -> None:
        api = FakeApi()
        api.writer.wait_seconds = 0.01
        e = engine()
        api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
        gate = asyncio.get_running_loop().create_future()

        async def slow_failing_apply(obj: dict[str, Any]) -> dict[str, Any]:
            await gate
            raise Transient("HTTP 504: timeout")

        api.create_applied = slow_failing_apply  # type: ignore[method-assign]
        await reconcile(api, e, {}, S, None, NOW, writer=api.writer)  # the PVC's create is still in flight
        gate.set_result(None)
        await asyncio.sleep(0)
        del api.create_applied  # the wire answers again: the next pass can only fail by the late failure
        other = FakeApi()
        other.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
        await reconcile(other, e, {}, S, None, NOW, writer=other.writer)  # a fresh writer: no failure of the first
        with pytest.raises(ApplyFailed) as info:
            await reconcile(api, e, {}, S, None, NOW, writer=api.writer)
        assert "HTTP 504: timeout" in str(info.value)

    asyncio.run(passes())


def test_reconcile_keeps_no_module_state() -> None:
    """reconcile.py holds no mutable module-level value (the shared-Job creates and the writes in flight are the
    write layer's instance state, k8s/writes.py): no dict, list, set or container built at import."""
    import ast
    from pathlib import Path

    import kvpilot.reconcile as reconcile_module

    tree = ast.parse(Path(reconcile_module.__file__).read_text())
    containers = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    built = {"dict", "list", "set", "deque", "defaultdict", "OrderedDict", "Counter"}
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, containers) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                             and value.func.id in built):
            found.append(ast.unparse(node)[:80])
    assert found == []


def test_metrics_valid_goes_when_autotune_is_turned_off() -> None:
    """MetricsValid says whether the pods' metrics were usable; with autotune off the operator reads none, so a
    condition kept from when it did ("Accepted: N samples", or a rejection) would be stale. merge_conditions
    keeps the types it was not given: the plan must retire this one."""
    from kvpilot.autotune.window import KvWindow

    api = FakeApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    kv = KvWindow(samples=12, pods=1, peak_utilization=0.4, mean_utilization=0.3, peak_used_blocks=40,
                  max_blocks=100, tokens_per_block=32, peak_active=8, mean_active=6.0, peak_queued=0,
                  mean_queued=0.0, paused=0, runtime_batch_size=64)
    tuned = engine(autotune={"enabled": True})
    p, _ = asyncio.run(reconcile(api, tuned, {}, S, kv, NOW, writer=api.writer))
    status = p.written or {}
    metrics = {c["type"]: c for c in status["conditions"]}.get("MetricsValid")
    assert metrics is not None and metrics["reason"] == "Accepted" and "12 samples" in metrics["message"]

    untuned = engine(autotune={"enabled": False}, generation=2)
    p, _ = asyncio.run(reconcile(api, untuned, status, S, None, NOW, writer=api.writer))
    assert "MetricsValid" not in {c["type"] for c in (p.written or {})["conditions"]}
    assert {"EngineReady", "Available", "Progressing", "Degraded", "ReleaseContract"} <= {
        c["type"] for c in (p.written or {})["conditions"]}
