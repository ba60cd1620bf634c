"""Free GPUs per node, from a watch of Nodes and of pods bound to nodes: may a surge pod be scheduled?

``serving.rollout.strategy: Auto`` rolls a retune with surge (new pods first) only by as many pods as the free
GPUs of the serving pods' product place; beyond that a surge pod would stay Pending until the progress deadline.
Kubernetes keeps no "allocated" figure on a Node: the scheduler sums the requests of the pods bound to it
(``spec.nodeName``) that have not terminated. This module does the same from two watches (Nodes, and pods of
every namespace), kept as small records (a node's labels, taints and allocatable GPUs; a pod's node and GPU
request), so a reconcile asks "is one more pod like this schedulable?" without any API call.

It is a conservative estimate, not the scheduler: it checks the node's labels against the pod's
``nodeSelector``, its NoSchedule/NoExecute taints against the pod's tolerations, readiness, cordoning and
free GPUs; it does not model node affinity, CPU or memory, or topology, nor pods still Pending (unbound), nor
other engines that read the same free GPUs for rollouts at the same moment. A wrong "yes" costs Pending surge
pods until GPUs free up or the rollout's deadline (maxUnavailable is 0, so the last good pods keep serving);
a wrong "no" costs capacity during a restart, as a cluster without a spare GPU would. A multi-node engine asks
``group_room``: a surge group needs ``size`` such pods at once, node by node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.k8s.cache import ChildKind

GPU_RESOURCE = "nvidia.com/gpu"
# keep_spec: the informer must not slim away what capacity reads (a node's taints, a pod's nodeName and requests).
NODE_KIND = ChildKind("v1", "Node", "nodes", keep_spec=True, managed_only=False)
# Every pod, not only kvpilot's: another workload's pod holds GPUs too.
BOUND_POD_KIND = ChildKind("v1", "Pod", "pods", keep_spec=True, managed_only=False)
_TERMINAL = ("Succeeded", "Failed")
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodeGpus:
    labels: tuple[tuple[str, str], ...]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) of NoSchedule/NoExecute taints
    schedulable: bool  # Ready and not cordoned
    allocatable: int


def gpu_count(value: Any) -> int:
    """A GPU quantity (``"8"``, ``8``); anything else (fractions, garbage from a hostile object) is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def node_gpus(node: dict[str, Any]) -> NodeGpus:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = meta.get("labels") or {}
    taints = tuple((str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
                   for t in spec.get("taints") or [] if isinstance(t, dict) and t.get("effect") in _BLOCKING_EFFECTS)
    ready = any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    return NodeGpus(
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, dict) else (),
        taints=taints,
        schedulable=ready and not spec.get("unschedulable"),
        allocatable=gpu_count((status.get("allocatable") or {}).get(GPU_RESOURCE)),
    )


def pod_gpus(spec: dict[str, Any]) -> int:
    """GPUs one pod (or pod template) requests, as the scheduler counts them: the sum over containers, or
    the largest init container if that is more. An extended resource's request defaults to its limit."""
    def one(container: Any) -> int:
        if not isinstance(container, dict):
            return 0
        res = container.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        return gpu_count(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE)))
    main = sum(one(c) for c in spec.get("containers") or [])
    init = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def tolerates(tolerations: list[dict[str, Any]], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if not isinstance(t, dict) or (t.get("effect") and t.get("effect") != effect):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == key):
            return True
        if t.get("operator", "Equal") == "Equal" and t.get("key") == key and str(t.get("value", "")) == value:
            return True
    return False


class GpuCapacity:
    """Allocatable GPUs per node and GPUs held per node, fed by the Node and Pod informers."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeGpus] = {}
        self._pods: dict[tuple[str, str], tuple[str, int]] = {}  # (ns, name) -> (node, GPUs); GPU pods only
        self._held: dict[str, int] = {}  # node -> GPUs requested by its live pods
        self._listed: set[str] = set()

    @property
    def synced(self) -> bool:
        """Both kinds listed once: before that, a "no spare GPU" could be wrong."""
        return {NODE_KIND.kind, BOUND_POD_KIND.kind} <= self._listed

    def listed(self, kind: str, items: list[dict[str, Any]]) -> None:
        if kind == NODE_KIND.kind:
            self._nodes = {}
        else:
            self._pods, self._held = {}, {}
        for item in items:
            self.event(kind, "ADDED", item)
        self._listed.add(kind)

    def event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if kind == NODE_KIND.kind:
            if event_type == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = node_gpus(obj)
            return
        key = (str(meta.get("namespace", "")), name)
        old = self._pods.pop(key, None)
        if old is not None:
            self._held[old[0]] -= old[1]
        if event_type == "DELETED":
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        node, gpus = str(spec.get("nodeName") or ""), pod_gpus(spec)
        if node and gpus and status.get("phase") not in _TERMINAL:
            self._pods[key] = (node, gpus)
            self._held[node] = self._held.get(node, 0) + gpus

    def free(self, node: str) -> int:
        n = self._nodes.get(node)
        return max(0, n.allocatable - self._held.get(node, 0)) if n else 0

    def fits(self, template_spec: dict[str, Any]) -> bool | None:
        """Whether one more pod of this template finds a node with its GPUs free. None: not known yet."""
        room = self.room(template_spec, 1)
        return None if room is None else room >= 1

    def room(self, template_spec: dict[str, Any], most: int) -> int | None:
        """How many more pods of this template (at most ``most``) the free GPUs would place, node by node as
        the scheduler would (a pod's GPUs come from one node). None: not known yet."""
        if not self.synced:
            return None
        want = pod_gpus(template_spec)
        selector = template_spec.get("nodeSelector") or {}
        tolerations = [t for t in template_spec.get("tolerations") or [] if isinstance(t, dict)]
        placed = 0
        for name, node in self._nodes.items():
            if placed >= most:
                break
            labels = dict(node.labels)
            if not node.schedulable or any(labels.get(k) != v for k, v in selector.items()):
                continue
            if all(tolerates(tolerations, taint) for taint in node.taints):
                placed += most if want <= 0 else self.free(name) // want
        return min(placed, most)

    def group_room(self, template_spec: dict[str, Any], size: int, most: int) -> int | None:
        """How many more groups of ``size`` pods of this template (at most ``most``) the free GPUs would place:
        a multi-node engine's surge is sized in groups, each needing ``size`` pods with their GPUs on one node
        each (one node per pod when a pod takes a node's GPUs, as gpusPerNode makes it). None: not known yet."""
        if size < 1:
            return 0
        slots = self.room(template_spec, most * size)
        return None if slots is None else slots // size
