"""Reads what one reconcile needs from the watch cache (``k8s/cache.py``) into an ``Observed``."""

from __future__ import annotations

import json
from typing import Any

from kvpilot.api.models import InferenceEngine
from kvpilot.api.status import EngineStatus
from kvpilot.autotune.window import KvWindow
from kvpilot.desired import labels as L
from kvpilot.desired.build import target_fingerprint
from kvpilot.desired.observed import (
    Observed,
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
    kv: KvWindow | None, gpus: GpuCapacity | None = None,
) -> Observed:
    """Everything one reconcile reads, from the watch cache: no API call (the cache is primed before the
    first reconcile and kept current by the watches, so a deletion or an edit is seen like any change).
    ``typed_status`` is the engine's stored status, parsed by the caller."""
    spec, meta = engine.spec, engine.meta
    ns = meta.namespace
    claim = cache_claim_name(meta, spec)
    index: dict[str, dict[str, Any]] = {}
    claim_phase = None
    claim_uid = ""
    if claim:
        pvc = cache.get("PersistentVolumeClaim", ns, claim)
        if pvc is not None:
            claim_phase = (pvc.get("status") or {}).get("phase", "Pending")
            claim_uid = pvc["metadata"].get("uid", "")
        index = parse_index(cache.index_entries(ns, claim), claim, claim_uid)
    job = None
    if spec.builds_engine:
        image = image_for(spec, settings.kvsim_image, settings.default_image)
        _ceiling, fp = target_fingerprint(spec, typed_status, image)
        job_obj = cache.get("Job", ns, L.build_job_name(fp, claim, claim_uid))
        if job_obj is not None:
            pods = cache.pods_of_job(ns, job_obj["metadata"]["name"])
            waiting = [m for p in pods if (m := pod_state(p).unschedulable_message)]
            job = job_state(job_obj, termination_message(pods), waiting[0] if waiting else None)
    dep = cache.get("Deployment", ns, L.deployment_name(meta.name))
    selector = L.server_selector(meta.name)
    pods = [p for p in cache.owned("Pod", ns, meta.name)
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]
    pod_states = tuple(pod_state(p) for p in pods)
    return Observed(
        status=typed_status,
        engine_index=index,
        job=job,
        deployment=deployment_state(dep) if dep else None,
        pods=pod_states,
        claim_phase=claim_phase,
        claim_uid=claim_uid,
        kv=kv,
        startup_seconds=startup_seconds(pod_states),
        surge_room=surge_room(dep, gpus),
    )


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
    spec, st = dep.get("spec") or {}, dep.get("status") or {}
    replicas = int(spec.get("replicas", 1) or 0)
    rolling = (int(st.get("observedGeneration") or 0) < int((dep.get("metadata") or {}).get("generation") or 0)
               or int(st.get("updatedReplicas") or 0) < replicas or int(st.get("replicas") or 0) > replicas
               or int(st.get("availableReplicas") or 0) < replicas)
    in_force = _surge_in_force(spec, replicas)
    if rolling:
        return in_force
    room = gpus.room(((spec.get("template") or {}).get("spec")) or {}, max(1, replicas))
    return in_force if room is None else room


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
