"""Reads what one reconcile needs from the API server into an ``Observed``."""

from __future__ import annotations

import json
from typing import Any

from kvpilot.api.models import InferenceEngine
from kvpilot.desired import labels as L
from kvpilot.desired.engine import target_fingerprint
from kvpilot.desired.observed import (
    KvWindow,
    Observed,
    deployment_state,
    job_state,
    pod_state,
    startup_seconds,
)
from kvpilot.desired.plan import Settings
from kvpilot.desired.pod_parts import image_for
from kvpilot.desired.storage import cache_claim_name
from kvpilot.k8s.api import Api


def termination_message(pods: list[dict[str, Any]]) -> str:
    """The newest build pod's termination message: the manifest on success, the log tail on failure."""
    newest = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    for pod in reversed(newest):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                return str(terminated.get("message") or terminated.get("reason") or "")
    return ""


def parse_index(config_map: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    out = {}
    for fp, text in ((config_map or {}).get("data") or {}).items():
        try:
            out[fp] = json.loads(text)
        except ValueError:
            continue  # a hand-edited entry: ignore it rather than fail every reconcile
    return out


async def observe_engine(
    api: Api, engine: InferenceEngine, status: dict[str, Any], settings: Settings, kv: KvWindow | None
) -> Observed:
    spec, meta = engine.spec, engine.meta
    ns = meta.namespace
    claim = cache_claim_name(meta, spec)
    index: dict[str, dict[str, Any]] = {}
    claim_phase = None
    if claim:
        pvc = await api.get("v1", "PersistentVolumeClaim", claim, ns)
        claim_phase = ((pvc or {}).get("status") or {}).get("phase", "Pending") if pvc else None
        index = parse_index(await api.get("v1", "ConfigMap", L.engine_index_name(claim), ns))
    job = None
    if spec.builds_engine:
        image = image_for(spec, settings.kvsim_image, settings.default_image)
        _ceiling, fp = target_fingerprint(spec, status, image)
        job_obj = await api.get("batch/v1", "Job", L.build_job_name(fp, claim), ns)
        if job_obj is not None:
            pods = await api.list("v1", "Pod", ns, f"job-name={job_obj['metadata']['name']}")
            waiting = [m for p in pods if (m := pod_state(p).unschedulable_message)]
            job = job_state(job_obj, termination_message(pods), waiting[0] if waiting else None)
    dep = await api.get("apps/v1", "Deployment", L.deployment_name(meta.name), ns)
    pods = await api.list("v1", "Pod", ns, L.selector_string(meta.name))
    pod_states = tuple(pod_state(p) for p in pods)
    return Observed(
        status=status,
        engine_index=index,
        job=job,
        deployment=deployment_state(dep) if dep else None,
        pods=pod_states,
        claim_phase=claim_phase,
        kv=kv,
        startup_seconds=startup_seconds(pod_states),
    )
