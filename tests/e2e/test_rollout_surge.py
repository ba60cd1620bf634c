"""serving.rollout.strategy Auto on a real API server: the operator watches Nodes and the pods bound to them
(k8s/capacity.py) and sizes each rollout's surge (maxUnavailable 0) by as many pods as the free GPUs of the
pods' product place, up to every replica: 2 with room for both, 1 when another workload leaves one GPU, surge
0 when it takes the last. Between rollouts a surge written is kept (GPUs taken alone write nothing); limits
without surge become a surge once GPUs are free."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.e2e.conftest import apply, get, kubectl, wait_for
from tests.e2e.test_simulated import sim_engine

PRODUCT = "NVIDIA-H200"  # hack/testenv/nodes.yaml: one kwok node with 8 of them
SURGE_ALL = {"maxSurge": 2, "maxUnavailable": 0}
SURGE_ONE = {"maxSurge": 1, "maxUnavailable": 0}
NO_SURGE = {"maxSurge": 0, "maxUnavailable": 1}


def rolling_update(ns: str) -> dict[str, Any] | None:
    dep = get("deployment", "sim", ns)
    return ((dep or {}).get("spec") or {}).get("strategy", {}).get("rollingUpdate")


def gpus_held_on(node_labels: dict[str, str]) -> tuple[int, int]:
    """(allocatable, requested by bound live pods of any namespace) over the nodes with these labels."""
    selector = ",".join(f"{k}={v}" for k, v in node_labels.items())
    nodes = json.loads(kubectl("get", "nodes", "-l", selector, "-o", "json"))["items"]
    names = {n["metadata"]["name"] for n in nodes}
    allocatable = sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) for n in nodes)
    pods = json.loads(kubectl("get", "pods", "-A", "-o", "json"))["items"]
    held = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", "0"))
               for p in pods if p["spec"].get("nodeName") in names
               and p["status"].get("phase") not in ("Succeeded", "Failed") for c in p["spec"]["containers"])
    return allocatable, held


def filler(ns: str, gpus: int, name: str = "filler") -> dict[str, Any]:
    """Another team's pod taking GPUs of the same product (kwok runs it: it is not a simulated kvpilot pod)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": PRODUCT},
                     "containers": [{"name": "train", "image": "registry.invalid/train:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def bound(ns: str, name: str) -> bool:
    return bool((get("pod", name, ns) or {}).get("spec", {}).get("nodeName"))


def roll(ns: str, batch: int) -> None:
    """A rollout the operator starts: a new runtime limit changes the pod template."""
    kubectl("patch", "ie", "sim", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"batching": {"maxBatchSize": batch}}}))
    wait_for(lambda: (get("deployment", "sim", ns) or {}).get("spec", {}).get("template", {}).get("metadata", {})
             .get("annotations", {}).get("serving.kvpilot.io/max-batch-size") == str(batch), 60,
             f"the Deployment to roll to max_batch_size {batch}")


def test_auto_sizes_each_rollouts_surge_by_the_free_gpus(ns: str) -> None:
    apply(sim_engine(ns, serving={"gpuProduct": PRODUCT, "replicas": 2}))
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    allocatable, held = gpus_held_on({"nvidia.com/gpu.product": PRODUCT})
    assert 0 < held and held + 2 <= allocatable, (allocatable, held)
    wait_for(lambda: rolling_update(ns) == SURGE_ALL, 60, "Auto to surge both replicas while 2+ GPUs are free")

    apply(filler(ns, allocatable - held - 1))
    wait_for(lambda: bound(ns, "filler"), 60, "the filler bound")
    time.sleep(10)  # three resyncs or more of the e2e operator (3 s): GPUs taken alone write nothing
    assert rolling_update(ns) == SURGE_ALL
    roll(ns, 48)
    assert rolling_update(ns) == SURGE_ONE  # the rollout is sized by the one GPU left
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    wait_for(lambda: gpus_held_on({"nvidia.com/gpu.product": PRODUCT})[1] == allocatable - 1, 120,
             "the old pods to release their GPUs")

    apply(filler(ns, 1, "filler-last"))
    wait_for(lambda: bound(ns, "filler-last"), 60, "the last filler bound")
    assert gpus_held_on({"nvidia.com/gpu.product": PRODUCT})[1] == allocatable
    roll(ns, 40)
    assert rolling_update(ns) == NO_SURGE  # no GPU free: the spec's limits
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")

    kubectl("delete", "pod", "filler", "filler-last", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(lambda: rolling_update(ns) == SURGE_ALL, 60, "Auto to surge both again once the GPUs are released")
