"""Free GPUs per node from Node and Pod watch events (k8s/capacity.py), and the Auto rollout's input
(observe/cluster.spare_gpu): a surge pod fits only where the scheduler could place it."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.k8s.capacity import GpuCapacity, gpu_count, pod_gpus
from kvpilot.observe.cluster import spare_gpu

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
               surge: bool = False, gpus: int = 1) -> dict[str, Any]:
    limits = {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    return {"metadata": {"generation": 2},
            "spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate", "rollingUpdate": limits},
                     "template": {"spec": template(gpus)}},
            "status": {"observedGeneration": 2, "replicas": pods, "updatedReplicas": updated,
                       "availableReplicas": available}}


def test_spare_gpu_asks_the_deployments_pod_template() -> None:
    c = capacity([node("a", "2")], [pod("serve-0", "a", 1, ns="llm")])
    assert spare_gpu(deployment(gpus=1), c) is True
    assert spare_gpu(deployment(gpus=2), c) is False
    assert spare_gpu(None, c) is None
    assert spare_gpu(deployment(), None) is None


@pytest.mark.parametrize("surge", [True, False])
def test_during_a_rollout_the_strategy_in_force_is_kept(surge: bool) -> None:
    full = capacity([node("a", "2")], [pod("old", "a", 1), pod("new", "a", 1)])  # the surge pod took the spare
    assert spare_gpu(deployment(updated=1, pods=2, available=1, surge=surge), full) is surge
    free = capacity([node("a", "2")], [pod("new", "a", 1)])  # NoSurge: the old pod is gone, the new one starts
    assert spare_gpu(deployment(updated=1, pods=1, available=0, surge=surge), free) is surge


@pytest.mark.parametrize("surge", [True, False])
def test_before_the_capacity_watches_list_the_strategy_in_force_is_kept(surge: bool) -> None:
    """An operator restart: until Nodes and pods are listed, capacity is unknown; re-rendering the strategy as
    "no surge" and back once they list would write every Auto engine's Deployment twice for nothing."""
    unsynced = GpuCapacity()
    assert unsynced.fits(template(1)) is None
    assert spare_gpu(deployment(surge=surge), unsynced) is surge
