"""Signals only from the engine's own pods (issue 22, item 2): a pod counts only when its owner chain, by UID
through the watch cache, leads to the Deployment this engine controls, and it runs the current template (or the
previous one, during a rollout). A pod with the engine's labels and any other chain is ignored and named in
Degraded (ForeignPods); a window from more pods than the engine runs feeds no decision."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from kvpilot.api.status import EngineStatus
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.k8s.cache import ChildCache
from kvpilot.observe.cluster import observe_engine
from kvpilot.observe.lineage import engine_pods
from kvpilot.observe.signals import at_most_replicas
from tests.unit.helpers import engine

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
LABELS = {"serving.kvpilot.io/engine": "e1", "app.kubernetes.io/component": "server",
          "app.kubernetes.io/managed-by": "kvpilot"}


def ref(kind: str, name: str, uid: str, api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def deployment(uid: str = "dep-1", revision: int = 3, owner: str = "uid-1") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "e1", "namespace": "ns", "uid": uid, "labels": LABELS,
                         "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                         "ownerReferences": [ref("InferenceEngine", "e1", owner, "serving.kvpilot.io/v1alpha1")]},
            "spec": {"replicas": 2, "template": {"metadata": {"annotations": {}}}}, "status": {}}


def replica_set(revision: int, dep_uid: str = "dep-1") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{'e1' if dep_uid == 'dep-1' else 'x'}-{revision}", "namespace": "ns",
                         "uid": f"rs-{revision}-{dep_uid}",
                         "labels": LABELS, "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                         "ownerReferences": [ref("Deployment", "e1", dep_uid)]}}


def pod(name: str, owner: dict[str, Any] | None, age_s: float = 300) -> dict[str, Any]:
    created = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}", "labels": LABELS,
                         "creationTimestamp": created, "ownerReferences": [owner] if owner else []},
            "status": {"podIP": "127.0.0.9", "startTime": created,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def cache_with(*objects: dict[str, Any]) -> ChildCache:
    cache = ChildCache()
    for obj in objects:
        cache.upsert(obj["kind"], obj)
    return cache


def rs_ref(revision: int, dep_uid: str = "dep-1") -> dict[str, Any]:
    return ref("ReplicaSet", f"e1-{revision}", f"rs-{revision}-{dep_uid}")


def test_only_pods_of_the_engines_deployment_and_its_current_or_previous_template_count() -> None:
    other = deployment(uid="dep-x", owner="someone-else")
    other["metadata"]["name"] = "x"
    pods = [pod("e1-3-a", rs_ref(3)), pod("e1-2-a", rs_ref(2)), pod("e1-1-a", rs_ref(1)),
            pod("e3-evil", None), pod("x-1-a", rs_ref(1, "dep-x")),
            pod("forged", ref("ReplicaSet", "e1-9", "no-such-uid")),  # older than the grace: reported
            pod("new", ref("ReplicaSet", "e1-4", "rs-not-listed-yet"), age_s=2)]  # its RS may be on its way
    cache = cache_with(deployment(), replica_set(1), replica_set(2), replica_set(3), other,
                       replica_set(1, "dep-x"), *pods)
    lineage = engine_pods(cache, "uid-1", pods, NOW)
    assert [p["metadata"]["name"] for p in lineage.own] == ["e1-3-a", "e1-2-a"]
    assert lineage.foreign == ("e3-evil", "forged", "x-1-a")  # e1-1-a is the engine's, of an older template


def test_a_deployment_the_engine_does_not_control_makes_every_pod_foreign() -> None:
    dep = deployment(owner="old-uid")  # the engine was deleted and re-created: its predecessor's Deployment
    pods = [pod("e1-3-a", rs_ref(3))]
    cache = cache_with(dep, replica_set(3), *pods)
    assert engine_pods(cache, "uid-1", pods, NOW).foreign == ("e1-3-a",)
    observed = observe_engine(cache, engine(), EngineStatus(), Settings(), None, now=NOW)
    assert observed.deployment is None and observed.pods == ()


def test_a_foreign_pod_is_named_in_degraded_and_is_not_observed() -> None:
    pods = [pod("e1-3-a", rs_ref(3)), pod("e3-evil", None)]
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "status": {"phase": "Bound"},
             "metadata": {"name": "engines", "namespace": "ns", "uid": "claim-1"}}
    cache = cache_with(deployment(), replica_set(3), claim, *pods)
    e = engine(autotune={"enabled": True})
    observed = observe_engine(cache, e, EngineStatus(), Settings(), None, now=NOW)
    assert [p.name for p in observed.pods] == ["e1-3-a"] and observed.foreign_pods == ("e3-evil",)
    degraded = plan(e, observed, Settings(), NOW).status.condition("Degraded")
    assert degraded is not None and degraded.reason == "ForeignPods" and "e3-evil" in degraded.message


def window(pods: int) -> KvWindow:
    return KvWindow(samples=280, pods=pods, peak_utilization=0.9, mean_utilization=0.8, peak_used_blocks=90,
                    max_blocks=100, tokens_per_block=32, peak_active=96, mean_active=90.0, peak_queued=400,
                    mean_queued=300.0, paused=0, runtime_batch_size=96)


def test_a_window_from_more_pods_than_the_engine_runs_feeds_no_decision() -> None:
    assert at_most_replicas(window(2), 2) == window(2)
    voided = at_most_replicas(window(3), 2)
    assert voided is not None and voided.samples == 0 and voided.rejected_samples == 280
    assert "3 pods reported" in (voided.rejection or "")
    e = engine(autotune={"enabled": True, "mode": "Auto"})
    decision = plan(e, Observed(kv=voided, claim_phase="Bound"), Settings(), NOW).decision
    assert decision is None or decision.action == "Hold"
