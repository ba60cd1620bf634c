"""Reads what one reconcile needs from the watch cache (``k8s/cache.py``) into an ``Observed``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvpilot.api.models import InferenceEngine
from kvpilot.api.status import EngineStatus
from kvpilot.autotune.window import KvWindow
from kvpilot.desired import labels as L
from kvpilot.desired.build import RETRY_ANNOTATION, retry_job_name, target_fingerprint
from kvpilot.desired.groups import lws_state
from kvpilot.desired.lws_pods import GroupPod, group_pod
from kvpilot.desired.multinode import WORKER_COMPONENT, lws_name
from kvpilot.desired.observed import (
    DeploymentState,
    Observed,
    PodState,
    deployment_state,
    job_state,
    pod_state,
    startup_seconds,
)
from kvpilot.desired.settings import Settings
from kvpilot.desired.pod_parts import image_for
from kvpilot.desired.storage import INDEX_CLAIM_UID_KEY, INDEX_MANIFEST_KEY, cache_claim_name
from kvpilot.k8s.cache import ChildCache
from kvpilot.k8s.capacity import GpuCapacity
from kvpilot.k8s.ownership import controlled_by, refusal
from kvpilot.k8s.writes import build_job_identity
from kvpilot.observe.lineage import PodLineage, engine_pods


def termination_message(pods: list[dict[str, Any]]) -> str:
    """The newest build pod's termination message: the manifest on success, the log tail on failure."""
    newest = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    for pod in reversed(newest):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                return str(terminated.get("message") or terminated.get("reason") or "")
    return ""


def parse_index(entries: list[dict[str, Any]], claim: str, claim_uid: str) -> dict[str, dict[str, Any]]:
    """The engines published on ``claim``, from its engine-index ConfigMaps (one per fingerprint).

    An entry counts only if it was recorded for this very claim (same UID): a claim deleted and re-created
    under the same name is empty, and trusting its predecessor's entries would start pods on a missing engine.
    """
    out = {}
    for cm in entries:
        data = cm.get("data") or {}
        if data.get("claim") != claim or not claim_uid or data.get(INDEX_CLAIM_UID_KEY) != claim_uid:
            continue
        try:
            manifest = json.loads(data.get(INDEX_MANIFEST_KEY) or "")
        except ValueError:
            continue  # a hand-edited entry: ignore it rather than fail every reconcile
        if isinstance(manifest, dict) and data.get("fingerprint"):
            out[str(data["fingerprint"])] = manifest
    return out


def observe_engine(
    cache: ChildCache, engine: InferenceEngine, typed_status: EngineStatus, settings: Settings,
    kv: KvWindow | None, gpus: GpuCapacity | None = None, now: datetime | None = None,
    canary_kv: tuple[KvWindow | None, KvWindow | None] = (None, None),
) -> Observed:
    """Everything one reconcile reads, from the watch cache: no API call (the cache is primed before the
    first reconcile and kept current by the watches, so a deletion or an edit is seen like any change).
    ``typed_status`` is the engine's stored status, parsed by the caller.

    Only what is the engine's counts (issue 22): its Deployment when this engine controls it, the build Job when
    it is kvpilot's build Job of these inputs, and the pods whose owner chain leads to that Deployment (or to its
    canary Deployment: autotune/canary.py) (observe/lineage.py); other pods wearing its labels are named in
    ``foreign_pods``. ``canary_kv``: the windows of a canary pod and of the other pods, when one runs."""
    spec, meta = engine.spec, engine.meta
    ns = meta.namespace
    claim = cache_claim_name(meta, spec)
    index: dict[str, dict[str, Any]] = {}
    claim_phase = None
    claim_uid = ""
    claim_terminating = False
    if claim:
        pvc = cache.get("PersistentVolumeClaim", ns, claim)
        if pvc is not None:
            claim_phase = (pvc.get("status") or {}).get("phase", "Pending")
            claim_uid = pvc["metadata"].get("uid", "")
            claim_terminating = bool(pvc["metadata"].get("deletionTimestamp"))
        index = parse_index(cache.index_entries(ns, claim), claim, claim_uid)
    job = None
    if spec.builds_engine:
        image = image_for(spec, settings.kvsim_image, settings.default_image)
        _ceiling, fp = target_fingerprint(spec, typed_status, image)
        job_name = L.build_job_name(fp, claim, claim_uid)
        request = meta.annotations.get(RETRY_ANNOTATION)
        retried = cache.get("Job", ns, retry_job_name(job_name, request)) if request else None
        if retried is not None:  # a retry the user asked for (desired/build.py) stands for the failed Job
            job_name = retried["metadata"]["name"]
        job_obj = retried or cache.get("Job", ns, job_name)
        if job_obj is not None and refusal(build_job_identity(ns, job_name, fp), job_obj, meta.uid) is None:
            pods = cache.pods_of_job(ns, job_obj["metadata"]["name"])
            waiting = [m for p in pods if (m := pod_state(p).unschedulable_message)]
            job = job_state(job_obj, termination_message(pods), waiting[0] if waiting else None)
    owned = cache.owned("Pod", ns, meta.name)
    serving = _multinode(cache, engine, owned, gpus) if spec.multinode else _single(cache, engine, gpus)
    servers = [p for p in owned if _component(p) == "server"]  # the ones that serve
    # Only the pods whose owner chain leads to the engine's Deployment (observe/lineage.py). A multi-node engine's
    # leaders are still taken by their labels: their chain runs through StatefulSets, which are not watched yet.
    lineage = PodLineage(tuple(servers), ()) if spec.multinode else engine_pods(cache, meta.uid, servers, now)
    pod_states = tuple(pod_state(p) for p in lineage.own)
    return Observed(
        status=typed_status,
        engine_index=index,
        job=job,
        deployment=serving.deployment,
        pods=pod_states,
        claim_phase=claim_phase,
        claim_uid=claim_uid,
        claim_terminating=claim_terminating,
        retry_build=meta.annotations.get(RETRY_ANNOTATION),
        kv=kv,
        startup_seconds=startup_seconds(pod_states),
        surge_room=serving.surge_room,
        workers=serving.workers,
        group_pods=serving.group_pods,
        foreign_pods=lineage.foreign,
        canary_deployment=serving.canary,
        canary_name_taken=serving.canary_taken,
        canary_kv=canary_kv[0],
        others_kv=canary_kv[1],
    )


def _component(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(L.COMPONENT_LABEL)


@dataclass(frozen=True)
class _Serving:
    """What serves the engine: its Deployment, or its LeaderWorkerSet counted in groups, and their pods."""

    deployment: DeploymentState | None
    surge_room: int | None
    workers: tuple[PodState, ...] = ()
    group_pods: tuple[GroupPod, ...] = ()
    canary: DeploymentState | None = None  # a canary retune's Deployment (desired/canary.py)
    canary_taken: bool = False  # its name is held by an object the engine does not control


def _single(cache: ChildCache, engine: InferenceEngine, gpus: GpuCapacity | None) -> _Serving:
    dep = cache.get("Deployment", engine.meta.namespace, L.deployment_name(engine.meta.name))
    if dep is not None and not controlled_by(dep, engine.meta.uid):
        dep = None  # not the engine's (NameConflict when it writes): nothing of it counts
    canary = cache.get("Deployment", engine.meta.namespace, L.canary_deployment_name(engine.meta.name))
    taken = canary is not None and not controlled_by(canary, engine.meta.uid)
    return _Serving(deployment_state(dep) if dep else None, surge_room(dep, gpus),
                    canary=deployment_state(canary) if canary is not None and not taken else None, canary_taken=taken)


def _multinode(cache: ChildCache, engine: InferenceEngine, owned: list[dict[str, Any]],
               gpus: GpuCapacity | None) -> _Serving:
    """A multi-node engine: the LeaderWorkerSet as a DeploymentState of groups, its workers, its group pods."""
    lws = cache.get("LeaderWorkerSet", engine.meta.namespace, lws_name(engine.meta.name))
    if lws is not None and not controlled_by(lws, engine.meta.uid):
        lws = None  # not the engine's, as for a Deployment
    workers = tuple(pod_state(p) for p in owned if _component(p) == WORKER_COMPONENT)
    group_pods = tuple(g for p in owned if (g := group_pod(p)) is not None)
    return _Serving(lws_state(lws) if lws else None, group_surge_room(lws, gpus, engine.spec.nodes_per_replica),
                    workers, group_pods)


def group_surge_room(lws: dict[str, Any] | None, gpus: GpuCapacity | None, size: int) -> int | None:
    """``surge_room`` in groups, for a LeaderWorkerSet: how many more groups of ``size`` pods the free GPUs would
    place (each pod on a node with its GPUs free), at most its replicas; the surge in force while it rolls."""
    if lws is None or gpus is None:
        return None
    spec = lws.get("spec") or {}
    replicas = int(spec.get("replicas", 1) or 0)
    limits = ((spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration")) or {}
    in_force = _surge_in_force({"strategy": {"rollingUpdate": limits}}, replicas)
    if _rolling(lws, replicas, "readyReplicas"):  # an LWS counts ready groups (it has no availableReplicas)
        return in_force
    worker = (((spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}).get("spec")) or {}
    room = gpus.group_room(worker, size, max(1, replicas))
    return in_force if room is None else room


def surge_room(dep: dict[str, Any] | None, gpus: GpuCapacity | None) -> int | None:
    """How many more serving pods the free GPUs would place, at most the Deployment's replicas
    (``serving.rollout.strategy: Auto`` surges by that many).

    Asked of the Deployment's own pod template (its GPU request, nodeSelector and tolerations), as the
    scheduler would place surge pods. While a rollout is under way, or while the capacity watches have not
    listed yet (an operator restart), the answer is the surge already in force: the surge pods hold the spare
    GPUs they found, and resizing the strategy mid-rollout, or on every restart until the watches list, would
    only write. None when unknown and nothing is in force (no Deployment yet, or no capacity watch): Auto
    then does not surge."""
    if dep is None or gpus is None:
        return None
    spec = dep.get("spec") or {}
    replicas = int(spec.get("replicas", 1) or 0)
    in_force = _surge_in_force(spec, replicas)
    if _rolling(dep, replicas, "availableReplicas"):
        return in_force
    room = gpus.room(((spec.get("template") or {}).get("spec")) or {}, max(1, replicas))
    return in_force if room is None else room


def _rolling(obj: dict[str, Any], replicas: int, serving_field: str) -> bool:
    """Whether a Deployment (or LeaderWorkerSet) still rolls: its status lags its spec, it has replicas beyond
    the spec's (surge), or fewer than the spec's serve (``serving_field``)."""
    st = obj.get("status") or {}
    return (int(st.get("observedGeneration") or 0) < int((obj.get("metadata") or {}).get("generation") or 0)
            or int(st.get("updatedReplicas") or 0) < replicas or int(st.get("replicas") or 0) > replicas
            or int(st.get(serving_field) or 0) < replicas)


def _surge_in_force(spec: dict[str, Any], replicas: int) -> int:
    """The Deployment's maxSurge when its maxUnavailable is 0 (a percentage of replicas rounds up, as the
    Deployment controller rounds it); 0 otherwise."""
    limits = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    if str(limits.get("maxUnavailable", "")) not in ("0", "0%"):
        return 0
    surge = str(limits.get("maxSurge", ""))
    try:
        if surge.endswith("%"):
            return max(0, -(-int(surge[:-1]) * replicas // 100))
        return max(0, int(surge))
    except ValueError:
        return 0
