"""Multi-node engines' groups (desired/groups.py): the LeaderWorkerSet as a DeploymentState counted in groups,
and status.groups, including a group recreated as one (a new leader under the same template revision) told
apart from a rollout (a new revision)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kvpilot.desired import groups as G
from kvpilot.desired import lws_pods as LP
from kvpilot.desired import labels as L

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def lws(replicas: int = 2, ready: int = 1, updated: int = 2, created: int = 2) -> dict[str, Any]:
    return {"metadata": {"generation": 3}, "spec": {
        "replicas": replicas,
        "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}},
        "leaderWorkerTemplate": {"leaderTemplate": {
            "metadata": {"annotations": {L.FINGERPRINT_ANNOTATION: "fp", L.BATCH_ANNOTATION: "64",
                                         L.CONFIG_HASH_ANNOTATION: "h"}},
            "spec": {"containers": [{"name": "server", "image": "img:1"}]}}}},
        "status": {"observedGeneration": 3, "replicas": created, "readyReplicas": ready, "updatedReplicas": updated}}


def pod(group: int, worker: int, uid: str, revision: str = "r1", ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "labels": {LP.GROUP_LABEL: str(group), LP.WORKER_LABEL: str(worker),
                                                LP.REVISION_LABEL: revision}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_lws_state_counts_groups() -> None:
    state = G.lws_state(lws())
    assert (state.replicas, state.ready_replicas, state.available_replicas, state.updated_replicas, state.pods) == (
        2, 1, 1, 2, 2)
    assert (state.fingerprint, state.max_batch_size, state.config_hash, state.image) == ("fp", "64", "h", "img:1")
    assert state.rolling_update == (1, 0) and not state.progress_deadline_exceeded
    assert G.lws_state({"metadata": {}, "spec": {"replicas": True}}).replicas == 1  # hostile values read as absent


def test_group_pod_reads_lws_labels_only() -> None:
    assert LP.group_pod(pod(1, 0, "u")) == LP.GroupPod(1, 0, "u", "r1", True)
    assert LP.group_pod({"metadata": {"labels": {LP.GROUP_LABEL: "x", LP.WORKER_LABEL: "0"}}}) is None
    assert LP.group_pod({"metadata": {}}) is None


def status(pods: list[dict[str, Any]], previous: Any = None, **kw: int) -> Any:
    parsed = [p for p in (LP.group_pod(x) for x in pods) if p]
    return G.groups_status(G.lws_state(lws(**kw)), parsed, 2, previous, NOW)


def test_groups_status_summarises_ready_groups_and_pods() -> None:
    s = status([pod(0, 0, "a"), pod(0, 1, "b"), pod(1, 0, "c"), pod(1, 1, "d", ready=False)])
    assert (s.replicas, s.ready, s.pods_per_group, s.ready_pods, s.summary) == (2, 1, 2, 3, "1/2")
    assert s.leaders == ("a:r1", "c:r1") and s.last_recreation is None


def test_a_new_leader_of_the_same_revision_is_a_recreated_group_even_across_a_gap() -> None:
    first = status([pod(0, 0, "a"), pod(0, 1, "b"), pod(1, 0, "c"), pod(1, 1, "d")], ready=2)
    gap = status([pod(1, 0, "c"), pod(1, 1, "d")], first, ready=1)  # group 0's pods are gone for a moment
    assert gap.leaders == ("a:r1", "c:r1") and gap.last_recreation is None
    back = status([pod(0, 0, "e", ready=False), pod(1, 0, "c"), pod(1, 1, "d")], gap, ready=1)
    assert back.last_recreation is not None and back.last_recreation.group == 0
    assert "RecreateGroupOnPodRestart" in (back.last_recreation.message or "")
    assert back.last_recreation.at == "2026-12-01T12:00:00Z"
    later = status([pod(0, 0, "e"), pod(0, 1, "f"), pod(1, 0, "c"), pod(1, 1, "d")], back, ready=2)
    assert later.last_recreation == back.last_recreation  # remembered, not re-announced


def test_a_rollout_replaces_leaders_under_a_new_revision_and_is_no_recreation() -> None:
    first = status([pod(0, 0, "a"), pod(1, 0, "c")], ready=2)
    rolled = status([pod(0, 0, "x", revision="r2"), pod(1, 0, "c")], first, ready=2)
    assert rolled.last_recreation is None and rolled.leaders == ("x:r2", "c:r1")
