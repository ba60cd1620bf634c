"""The watch cache, the drift check, the work queue, the event recorder and the repeat filter (issue 12)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kvpilot.k8s.cache import ChildCache, slim
from kvpilot.k8s.drift import APPLIED_HASH_ANNOTATION, needs_apply, owned_fields_differ, with_applied_hash
from kvpilot.k8s.events import AGGREGATE_WINDOW_SECONDS, EventRecorder
from kvpilot.logfilter import RepeatFilter
from kvpilot.workqueue import CHANGE, RESYNC, PrioritySlots


def pod(name: str, rv: str, engine: str = "e1", job: str | None = None, ready: str = "True") -> dict[str, Any]:
    labels = {"serving.kvpilot.io/engine": engine, **({"job-name": job} if job else {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels,
                         "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
            "spec": {"containers": [{"name": "c", "image": "x" * 1000}]},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def test_the_cache_keeps_what_decisions_read_and_indexes_by_owner_and_job() -> None:
    cache = ChildCache()
    assert cache.upsert("Pod", pod("p1", "10")) is True
    assert cache.upsert("Pod", pod("b1", "11", engine="e2", job="kvpilot-build-x")) is True
    stored = cache.get("Pod", "ns", "p1")
    assert stored is not None and "managedFields" not in stored["metadata"] and "spec" not in stored
    assert [p["metadata"]["name"] for p in cache.owned("Pod", "ns", "e1")] == ["p1"]
    assert [p["metadata"]["name"] for p in cache.pods_of_job("ns", "kvpilot-build-x")] == ["b1"]
    assert cache.delete("Pod", pod("p1", "12")) is True
    assert cache.owned("Pod", "ns", "e1") == [] and cache.get("Pod", "ns", "p1") is None


def test_only_a_real_change_counts_and_a_late_event_never_rolls_back() -> None:
    cache = ChildCache()
    cache.upsert("Pod", pod("p1", "10", ready="False"))
    assert cache.upsert("Pod", pod("p1", "11", ready="False")) is False  # only the resourceVersion moved
    assert cache.upsert("Pod", pod("p1", "12", ready="True")) is True
    assert cache.upsert("Pod", pod("p1", "9", ready="False")) is False  # older than what is cached
    assert cache.get("Pod", "ns", "p1")["status"]["conditions"][0]["status"] == "True"  # type: ignore[index]


def deployment(replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "e1", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}, "ports": [{"containerPort": 8000}]}]}}}}


def live_of(desired: dict[str, Any]) -> dict[str, Any]:
    """What the server stores: defaults added, quantities as strings, bookkeeping, no managedFields kept."""
    live = with_applied_hash(desired)
    live["metadata"] = {**live["metadata"], "uid": "u", "resourceVersion": "5", "generation": 1}
    c = live["spec"]["template"]["spec"]["containers"][0]
    live["spec"]["template"]["spec"]["containers"][0] = {
        **c, "resources": {"limits": {"nvidia.com/gpu": "1"}}, "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8000, "protocol": "TCP"}]}
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    return slim("Deployment", {**live, "status": {"replicas": 1}})


def test_an_applied_object_with_server_defaults_needs_no_apply() -> None:
    assert needs_apply(deployment(), live_of(deployment())) is None
    assert needs_apply(deployment(), None) == "absent"


def test_a_rendering_change_or_an_out_of_band_edit_needs_an_apply() -> None:
    assert needs_apply(deployment(replicas=2), live_of(deployment())) == "rendering changed"
    edited = live_of(deployment())
    edited["spec"]["replicas"] = 5
    assert needs_apply(deployment(), edited) == "edited out of band at /spec/replicas"
    relabelled = live_of(deployment())
    relabelled["metadata"]["labels"] = {"a": "changed"}
    assert needs_apply(deployment(), relabelled) == "edited out of band at /metadata/labels/a"
    assert owned_fields_differ({"x": {}}, {}) is None  # an empty map matches a field the server dropped
    assert APPLIED_HASH_ANNOTATION in with_applied_hash(deployment())["metadata"]["annotations"]


def test_pending_changes_are_served_before_resyncs_and_the_bound_holds() -> None:
    order: list[str] = []
    running = {"now": 0, "peak": 0}

    async def work(slots: PrioritySlots, name: str, priority: int) -> None:
        async with slots.hold(priority):
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
            order.append(name)
            await asyncio.sleep(0.01)
            running["now"] -= 1

    async def main() -> None:
        slots = PrioritySlots(2)
        tasks = [asyncio.create_task(work(slots, f"resync{i}", RESYNC)) for i in range(4)]
        await asyncio.sleep(0)  # the first two hold the slots, the others queue
        tasks.append(asyncio.create_task(work(slots, "change", CHANGE)))
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert running["peak"] == 2
    assert order.index("change") == 2  # right after the two that were already running


class _EventsApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", obj["reason"]))
        return {**obj, "metadata": {**obj["metadata"], "name": f"e1.{len(self.calls)}"}}

    async def merge_patch(self, api_version: str, kind: str, name: str, ns: str, patch: dict[str, Any]) -> Any:
        self.calls.append(("patch", (name, patch["count"])))
        return {}


def test_repeated_events_are_counted_on_one_event_like_the_kubernetes_recorder() -> None:
    now = [0.0]
    api = _EventsApi()
    rec = EventRecorder(api, clock=lambda: now[0])  # type: ignore[arg-type]
    involved = {"metadata": {"name": "e1", "namespace": "ns", "uid": "u1"}}

    async def main() -> None:
        for _ in range(3):
            await rec.record(involved, "Warning", "ApplyFailed", "Could not apply Deployment e1")
        await rec.record(involved, "Warning", "ApplyFailed", "another message")
        now[0] += AGGREGATE_WINDOW_SECONDS + 1
        await rec.record(involved, "Warning", "ApplyFailed", "another message")

    asyncio.run(main())
    assert api.calls == [("create", "ApplyFailed"), ("patch", ("e1.1", 2)), ("patch", ("e1.1", 3)),
                         ("create", "ApplyFailed"), ("create", "ApplyFailed")]


def test_a_repeated_warning_is_logged_once_per_window_with_a_count() -> None:
    now = [0.0]
    f = RepeatFilter(window_seconds=300, clock=lambda: now[0])

    def rec(pod_name: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.WARNING, "f", 1, "Could not scrape metrics from Pod %s: %s",
                                 (pod_name, "timeout"), None)

    shown = [f.filter(rec("p1")) for _ in range(10)] + [f.filter(rec("p2"))]
    assert shown == [True] + [False] * 9 + [True]
    now[0] = 301
    again = rec("p1")
    assert f.filter(again) and "9 repeats" in again.getMessage()


def test_a_fresh_list_drops_what_was_deleted_while_nobody_watched() -> None:
    cache = ChildCache()
    cache.upsert("Pod", pod("p1", "10"))
    cache.upsert("Pod", pod("p2", "10"))
    other = pod("p3", "10")
    other["metadata"]["namespace"] = "other"
    cache.upsert("Pod", other)
    changed = cache.replace("Pod", [pod("p1", "10"), pod("p4", "11")], namespace="ns")
    assert sorted(o["metadata"]["name"] for o in changed) == ["p2", "p4"]  # p1 unchanged, p2 gone, p4 new
    assert cache.get("Pod", "ns", "p2") is None and cache.get("Pod", "other", "p3") is not None
    assert cache.count("Pod") == 3


def test_a_shared_job_gaining_an_owner_wakes_nobody_and_its_status_wakes_every_owner() -> None:
    from kvpilot.desired.settings import Settings
    from kvpilot.k8s.api import Api
    from kvpilot.loop import EngineLoop, EngineLoops

    loops = EngineLoops(Api(api_client=object(), pool_size=1), Settings(), 30.0)  # type: ignore[arg-type]
    for name in ("e1", "e2", "e3"):
        loops.loops[("ns", name)] = EngineLoop(key=("ns", name), body={})

    def job(rv: str, owners: list[str], status: dict[str, Any]) -> dict[str, Any]:
        refs = [{"kind": "InferenceEngine", "name": o, "uid": f"u-{o}"} for o in owners]
        return {"apiVersion": "batch/v1", "kind": "Job", "status": status,
                "metadata": {"name": "build-x", "namespace": "ns", "resourceVersion": rv, "ownerReferences": refs}}

    def woken() -> set[str]:
        out = {k[1] for k, loop in loops.loops.items() if loop.wake.is_set()}
        for loop in loops.loops.values():
            loop.wake.clear()
        return out

    loops.watches.child_changed("Job", job("10", ["e1"], {"active": 1}))
    assert woken() == {"e1"}
    loops.watches.child_changed("Job", job("11", ["e1", "e2"], {"active": 1}))  # e2 joined: it knows
    loops.watches.child_changed("Job", job("12", ["e1", "e2", "e3"], {"active": 1}))
    assert woken() == set()
    loops.watches.child_changed("Job", job("13", ["e1", "e2", "e3"], {"succeeded": 1}))  # the build finished
    assert woken() == {"e1", "e2", "e3"}
    loops.watches.child_deleted("Job", job("14", ["e1", "e2", "e3"], {"succeeded": 1}))
    assert woken() == {"e1", "e2", "e3"}


def test_a_capacity_watch_keeps_what_the_child_cache_drops_of_a_pod() -> None:
    """The child cache keeps a pod's status only; the GPU-capacity watch of every pod slims by its own kind and
    must keep spec.nodeName and the GPU requests, or every node looks free and Auto always surges."""
    from kvpilot.k8s.capacity import BOUND_POD_KIND, pod_gpus

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "managedFields": [{"manager": "x"}]},
           "spec": {"nodeName": "gpu-h200-0", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
           "status": {"phase": "Running"}}
    assert "spec" not in slim("Pod", pod)
    kept = slim("Pod", pod, keep_spec=BOUND_POD_KIND.keep_spec)
    assert kept["spec"]["nodeName"] == "gpu-h200-0" and pod_gpus(kept["spec"]) == 2
    assert "managedFields" not in kept["metadata"]
