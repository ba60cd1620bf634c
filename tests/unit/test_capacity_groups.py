"""Surge in groups (k8s/capacity.py group_room): a multi-node engine's surge group needs `size` pods, each on a
node with the pod's GPUs free, counted node by node."""

from __future__ import annotations

from typing import Any

from kvpilot.k8s.capacity import BOUND_POD_KIND, NODE_KIND, GpuCapacity

POOL = {"kvpilot.io/testenv-pool": "multinode"}


def node(name: str, gpus: int = 8, labels: dict[str, str] | None = None, taint: bool = True) -> dict[str, Any]:
    spec = {"taints": [{"key": "kvpilot.io/testenv-pool", "value": "multinode", "effect": "NoSchedule"}]} if taint else {}
    return {"metadata": {"name": name, "labels": {**POOL, **(labels or {})}}, "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}}


def holder(name: str, on: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "x", "name": name}, "spec": {"nodeName": on, "containers": [
        {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": "Running"}}


TEMPLATE = {"nodeSelector": POOL, "tolerations": [{"key": "kvpilot.io/testenv-pool", "operator": "Exists"}],
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]}


def capacity(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> GpuCapacity:
    cap = GpuCapacity()
    cap.listed(NODE_KIND.kind, nodes)
    cap.listed(BOUND_POD_KIND.kind, pods)
    return cap


def test_a_surge_group_needs_size_nodes_with_a_whole_pod_of_gpus_free() -> None:
    nodes = [node(f"n{i}") for i in range(6)]
    # Two groups of 2 serve on n0..n3; n4 is free, n5 has 4 GPUs taken: one pod fits, not a group of 2.
    pods = [holder(f"p{i}", f"n{i}", 8) for i in range(4)] + [holder("other", "n5", 4)]
    cap = capacity(nodes, pods)
    assert cap.room(TEMPLATE, 10) == 1
    assert cap.group_room(TEMPLATE, 2, 2) == 0
    cap.event(BOUND_POD_KIND.kind, "DELETED", holder("other", "n5", 4))
    assert cap.group_room(TEMPLATE, 2, 2) == 1  # n4 and n5 both free: one group of two
    assert cap.group_room(TEMPLATE, 2, 1) == 1


def test_group_room_counts_only_nodes_the_pods_may_use_and_is_unknown_before_sync() -> None:
    assert GpuCapacity().group_room(TEMPLATE, 2, 2) is None
    untolerated = {**TEMPLATE, "tolerations": []}
    cap = capacity([node("a"), node("b"), node("c", taint=False, labels={"other": "x"})], [])
    assert cap.group_room(TEMPLATE, 2, 5) == 1  # three usable nodes: one group of two, the third is half a group
    assert cap.group_room(untolerated, 2, 5) == 0  # only c is untainted: half a group
