"""Which pods are the engine's own: signals only from them (issue 22).

A pod wearing an engine's labels is not the engine's pod: anyone who may create pods in the namespace can give
one those labels, serve believable stats from it, and (the issue's trial) make the tuner raise the batch size.
So a pod counts only if its owner chain, followed by UID through the watch cache, leads to the engine's serving
workload: pod -> ReplicaSet -> the Deployment whose controller is this engine's UID (a LeaderWorkerSet's chain is
longer; the walk is the same). And only if it runs that workload's current template, or, during a rollout, the
previous one (the ReplicaSet of the Deployment's revision, or the newest before it): the old pods of an older
rollout describe another configuration.

Pods with the engine's labels whose chain leads elsewhere, or nowhere, are ``foreign``: ignored, and named in
status (Degraded, ForeignPods). A pod whose ReplicaSet is not cached yet (its watch event can trail the pod's by
a moment during a rollout) is neither counted nor reported, unless it is older than ``UNSEEN_GRACE_SECONDS``: by
then a real ReplicaSet would have been listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvpilot.api.timestamps import parse_rfc3339
from kvpilot.k8s.cache import ChildCache
from kvpilot.k8s.ownership import controlled_by, controller_of

REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
UNSEEN_GRACE_SECONDS = 30.0
MAX_CHAIN = 5  # pod -> ReplicaSet -> Deployment is 2; a LeaderWorkerSet's worker pods have 4 above them


@dataclass(frozen=True)
class PodLineage:
    own: tuple[dict[str, Any], ...]  # the engine's pods of the current (or previous) template
    foreign: tuple[str, ...]  # names of pods with the engine's labels that its workload did not create


def _revision(obj: dict[str, Any]) -> int:
    try:
        return int(((obj.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION) or 0)
    except ValueError:
        return 0


def _deployment_template_ok(cache: ChildCache, workload: dict[str, Any], below: dict[str, Any]) -> bool:
    """The ReplicaSet ``below`` runs the Deployment's current template, or the newest one before it."""
    current = _revision(workload)
    mine = _revision(below)
    if not current or mine == current:
        return mine == current
    meta = workload["metadata"]
    uid = meta.get("uid", "")
    older = [_revision(rs) for rs in cache.owned("ReplicaSet", meta.get("namespace", ""),
                                                 (meta.get("labels") or {}).get("serving.kvpilot.io/engine", ""))
             if (controller_of(rs) or {}).get("uid") == uid and _revision(rs) < current]
    return bool(older) and mine == max(older)


# How to tell that the object just below a workload runs its current (or previous) template, by workload kind. A
# kind without a rule here counts every pod its chain reaches (the LeaderWorkerSet's rule comes with it).
TEMPLATE_RULES: dict[str, Callable[[ChildCache, dict[str, Any], dict[str, Any]], bool]] = {
    "Deployment": _deployment_template_ok,
}


def _age_seconds(pod: dict[str, Any], now: datetime) -> float:
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return 0.0
    try:
        return (now - parse_rfc3339(str(created), now.tzinfo)).total_seconds()
    except ValueError:
        return 0.0


def _chain(cache: ChildCache, pod: dict[str, Any], engine_uid: str) -> list[dict[str, Any]] | None:
    """The objects above the pod, up to the one the engine controls; [] when a link is not cached (yet); None
    when the chain leads elsewhere or nowhere."""
    namespace = pod["metadata"].get("namespace", "")
    chain: list[dict[str, Any]] = []
    obj = pod
    for _ in range(MAX_CHAIN):
        ref = controller_of(obj)
        if ref is None:
            return None
        parent = cache.by_uid(str(ref.get("uid", "")))
        if parent is None:
            return []
        if parent.get("kind") != ref.get("kind") or parent["metadata"].get("namespace", "") != namespace:
            return None
        chain.append(parent)
        if controlled_by(parent, engine_uid):
            return chain
        obj = parent
    return None


def engine_pods(cache: ChildCache, engine_uid: str, pods: Iterable[dict[str, Any]],
                now: datetime | None = None) -> PodLineage:
    """Split ``pods`` (those wearing the engine's labels) into its own and the foreign ones."""
    own: list[dict[str, Any]] = []
    foreign: list[str] = []
    for pod in pods:
        chain = _chain(cache, pod, engine_uid)
        name = pod["metadata"].get("name", "")
        if chain is None:
            foreign.append(name)
            continue
        if not chain:  # a link not cached yet
            if now is not None and _age_seconds(pod, now) > UNSEEN_GRACE_SECONDS:
                foreign.append(name)
            continue
        workload = chain[-1]
        below = chain[-2] if len(chain) > 1 else pod
        rule = TEMPLATE_RULES.get(str(workload.get("kind")))
        if rule is None or rule(cache, workload, below):
            own.append(pod)
    return PodLineage(tuple(own), tuple(sorted(foreign)))
