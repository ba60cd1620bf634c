"""Free GPUs per node from Node and Pod watch events (k8s/capacity.py), and the Auto rollout's input
(observe/cluster.surge_room): a surge pod fits only where the scheduler could place it."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.k8s.capacity import GpuCapacity, gpu_count, pod_gpus
from kvpilot.observe.cluster import surge_room

H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: Any = "8", product: str = H100, ready: bool = True, cordoned: bool = False,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {"unschedulable": cordoned, "taints": taints or []},
            "status": {"allocatable": {"nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, node_name: str | None, gpus: int, ns: str = "other", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node_name,
                     "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def template(gpus: int = 1, product: str = H100, tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"nodeSelector": {"nvidia.com/gpu.product": product}, "tolerations": tolerations or [],
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}


def capacity(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> GpuCapacity:
    c = GpuCapacity()
    c.listed("Node", nodes)
    c.listed("Pod", pods)
    return c


def test_unknown_until_both_kinds_are_listed() -> None:
    c = GpuCapacity()
    assert c.fits(template()) is None
    c.listed("Node", [node("a")])
    assert c.fits(template()) is None
    c.listed("Pod", [])
    assert c.fits(template()) is True


def test_pods_of_any_namespace_hold_gpus_until_they_terminate_or_go() -> None:
    c = capacity([node("a", "8")], [pod("train", "a", 7), pod("web", "a", 0)])
    assert c.free("a") == 1
    assert c.fits(template(1)) is True and c.fits(template(2)) is False
    c.event("Pod", "ADDED", pod("serve", "a", 1, ns="team"))
    assert c.fits(template(1)) is False
    c.event("Pod", "MODIFIED", pod("train", "a", 7, phase="Succeeded"))  # finished: its GPUs are free again
    assert c.free("a") == 7
    c.event("Pod", "MODIFIED", pod("train", "a", 7))  # counted once however often it is seen
    c.event("Pod", "MODIFIED", pod("train", "a", 7))
    assert c.free("a") == 0
    c.event("Pod", "DELETED", pod("train", "a", 7))
    assert c.free("a") == 7


def test_unbound_pods_hold_nothing() -> None:
    assert capacity([node("a", "1")], [pod("pending", None, 1)]).fits(template(1)) is True


@pytest.mark.parametrize("bad", [node("x", product="NVIDIA-A100"), node("x", ready=False), node("x", cordoned=True),
                                 node("x", taints=[{"key": "gpu", "value": "busy", "effect": "NoSchedule"}])])
def test_a_node_the_pod_cannot_use_offers_no_spare_gpu(bad: dict[str, Any]) -> None:
    assert capacity([bad], []).fits(template(1)) is False


def test_a_tolerated_taint_does_not_block() -> None:
    tainted = node("x", taints=[{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"},
                                {"key": "spot", "effect": "PreferNoSchedule"}])
    assert capacity([tainted], []).fits(template(1, tolerations=[
        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}])) is True
    assert capacity([tainted], []).fits(template(1, tolerations=[
        {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "real"}])) is False


def test_a_tensor_parallel_pod_needs_all_its_gpus_on_one_node() -> None:
    c = capacity([node("a", "8"), node("b", "8")], [pod("p", "a", 6), pod("q", "b", 6)])
    assert c.free("a") + c.free("b") == 4
    assert c.fits(template(4)) is False and c.fits(template(2)) is True


@pytest.mark.parametrize("value, count", [("8", 8), (8, 8), (" 2 ", 2), ("0.5", 0), ("-1", 0), (-3, 0), (True, 0),
                                          (None, 0), ({"x": 1}, 0), ("1e3", 0)])
def test_hostile_quantities_count_as_no_gpu(value: Any, count: int) -> None:
    assert gpu_count(value) == count


def test_hostile_objects_do_not_crash() -> None:
    c = GpuCapacity()
    c.listed("Node", [{"metadata": {"name": "n"}, "spec": {"taints": ["x", {"effect": 3}]}, "status": {}},
                      {"metadata": {"name": "m", "labels": None}}])
    c.listed("Pod", [{"metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": [None, "x"]}}])
    assert c.fits(template(1)) is False


def test_init_containers_count_when_larger() -> None:
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    assert pod_gpus(spec) == 2


def deployment(replicas: int = 1, updated: int = 1, available: int = 1, pods: int = 1,
               surge: int = 0, gpus: int = 1, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    if limits is None:
        limits = {"maxSurge": surge, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    return {"metadata": {"generation": 2},
            "spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate", "rollingUpdate": limits},
                     "template": {"spec": template(gpus)}},
            "status": {"observedGeneration": 2, "replicas": pods, "updatedReplicas": updated,
                       "availableReplicas": available}}


def test_surge_room_asks_the_deployments_pod_template() -> None:
    c = capacity([node("a", "2")], [pod("serve-0", "a", 1, ns="llm")])
    assert surge_room(deployment(gpus=1), c) == 1
    assert surge_room(deployment(gpus=2), c) == 0
    assert surge_room(None, c) is None
    assert surge_room(deployment(), None) is None


def test_surge_room_counts_pods_node_by_node_up_to_the_replicas() -> None:
    """A 2-GPU pod needs both GPUs on one node: 1 free on each of two nodes places none; 8 free GPUs place
    four 2-GPU pods, but a Deployment of 2 replicas never surges by more than 2."""
    split = capacity([node("a", "2"), node("b", "2")], [pod("x", "a", 1), pod("y", "b", 1)])
    assert surge_room(deployment(replicas=2, updated=2, available=2, pods=2, gpus=2), split) == 0
    assert surge_room(deployment(replicas=2, updated=2, available=2, pods=2, gpus=1), split) == 2
    roomy = capacity([node("a", "8")], [])
    assert roomy.room(template(2), 10) == 4
    assert surge_room(deployment(replicas=2, updated=2, available=2, pods=2, gpus=2), roomy) == 2
    assert surge_room(deployment(replicas=3, updated=3, available=3, pods=3, gpus=4), roomy) == 2


@pytest.mark.parametrize(("limits", "in_force"), [
    ({"maxSurge": "50%", "maxUnavailable": "0%"}, 2),  # a percentage rounds up, as the Deployment controller does
    ({"maxSurge": 3, "maxUnavailable": 0}, 3),
    ({"maxSurge": 3, "maxUnavailable": 1}, 0),  # capacity drops: not surge
    ({"maxSurge": "lots", "maxUnavailable": 0}, 0),  # unreadable: no surge
])
def test_a_rollout_keeps_the_surge_in_force_as_written(limits: dict[str, Any], in_force: int) -> None:
    full = capacity([node("a", "3")], [pod("x", "a", 3)])
    rolling = deployment(replicas=3, updated=1, available=3, pods=4, limits=limits)
    assert surge_room(rolling, full) == in_force


@pytest.mark.parametrize("surge", [1, 0])
def test_during_a_rollout_the_strategy_in_force_is_kept(surge: int) -> None:
    full = capacity([node("a", "2")], [pod("old", "a", 1), pod("new", "a", 1)])  # the surge pod took the spare
    assert surge_room(deployment(updated=1, pods=2, available=1, surge=surge), full) == surge
    free = capacity([node("a", "2")], [pod("new", "a", 1)])  # NoSurge: the old pod is gone, the new one starts
    assert surge_room(deployment(updated=1, pods=1, available=0, surge=surge), free) == surge


@pytest.mark.parametrize("surge", [1, 0])
def test_before_the_capacity_watches_list_the_strategy_in_force_is_kept(surge: int) -> None:
    """An operator restart: until Nodes and pods are listed, capacity is unknown; re-rendering the strategy as
    "no surge" and back once they list would write every Auto engine's Deployment twice for nothing."""
    unsynced = GpuCapacity()
    assert unsynced.fits(template(1)) is None
    assert surge_room(deployment(surge=surge), unsynced) == surge
