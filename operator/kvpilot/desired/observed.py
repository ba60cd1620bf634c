"""What one reconcile observed, as plain values the pure functions can reason about.

The I/O layer (``kvpilot.observe``) fills this from the API server and the pods; tests build it by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvpilot.api.timestamps import parse_rfc3339
from kvpilot.desired import labels as L
from kvpilot.desired.lws_pods import GroupPod
from kvpilot.api.status import EngineStatus
from kvpilot.autotune.trust import ModelView
from kvpilot.autotune.window import KvWindow

__all__ = ["DeploymentState", "JobState", "KvWindow", "Observed", "PodState"]  # KvWindow: re-exported


@dataclass(frozen=True)
class JobState:
    """The build Job of the current fingerprint, reduced to what the decisions need."""

    name: str
    active: bool
    succeeded: bool
    failed: bool
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None
    owner_uids: tuple[str, ...] = ()
    unschedulable_message: str | None = None  # the build pod waits for GPUs (or another node resource)
    failed_at: str | None = None  # when the Job failed (its Failed condition's transition): retries compare with it

    def manifest(self) -> dict[str, Any] | None:
        """The builder writes its engine manifest (JSON) as the termination message on success."""
        try:
            data = json.loads(self.message)
        except (ValueError, TypeError):
            return None
        return data if isinstance(data, dict) and "fingerprint" in data else None


@dataclass(frozen=True)
class PodState:
    """One serving pod."""

    name: str
    ready: bool
    fingerprint: str | None
    unschedulable_message: str | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    restarts: int = 0
    ip: str | None = None
    started_at: str | None = None
    deleting: bool = False
    ready_after_s: float | None = None  # start to Ready: what a restart costs this pod
    # The last exit of a container that stopped (kubelet's lastState.terminated): its exit code and the
    # termination message, which holds the cause (the log tail: terminationMessagePolicy FallbackToLogsOnError).
    last_exit: str | None = None
    canary: bool = False  # a canary retune's pod (label serving.kvpilot.io/canary: autotune/canary.py)
    max_batch_size: str | None = None  # the runtime limit its template gave it (annotation), as written


@dataclass(frozen=True)
class DeploymentState:
    generation: int
    observed_generation: int
    replicas: int
    updated_replicas: int
    ready_replicas: int
    available_replicas: int
    progress_deadline_exceeded: bool
    fingerprint: str | None
    max_batch_size: str | None
    config_hash: str | None
    pods: int = 0  # pods that exist (status.replicas), what the scale subresource reports
    image: str | None = None  # the serving container's image in the pod template
    # The strategy as written (maxSurge, maxUnavailable), when both are plain integers; None otherwise.
    rolling_update: tuple[int, int] | None = None


@dataclass(frozen=True)
class Observed:
    status: EngineStatus = field(default_factory=EngineStatus)  # the engine's own status as last written
    engine_index: dict[str, dict[str, Any]] = field(default_factory=dict)
    job: JobState | None = None
    deployment: DeploymentState | None = None
    pods: tuple[PodState, ...] = ()
    claim_phase: str | None = None  # the cache claim's phase, None when absent
    claim_terminating: bool = False  # the cache claim is being deleted (held by the pods that still mount it)
    retry_build: str | None = None  # the engine's serving.kvpilot.io/retry-build annotation (desired/build.py)
    claim_uid: str = ""  # the cache claim's UID once observed: names its build Job, validates index entries
    kv: KvWindow | None = None
    startup_seconds: float | None = None  # how long serving pods took from start to Ready (restart cost)
    # A multi-node engine's worker pods (its leaders are ``pods``, the ones scraped): what they wait on (GPUs, a
    # crash) surfaces in the conditions like a serving pod's. And every pod of its groups, for status.groups.
    workers: tuple[PodState, ...] = ()
    group_pods: tuple[GroupPod, ...] = ()
    # How many more serving pods the free GPUs of their product would place, at most the replicas (None: not
    # observed). Read by desired/rollout.py for serving.rollout.strategy Auto; filled by the cluster observer.
    surge_room: int | None = None
    # The engine's model as the tuner's fit of its pods leaves it (autotune/trust.py, ModelView: the calibrated
    # profile, the trust verdict, status.autotune.model); None: not fitted (no iterations seen, tuning off).
    model: ModelView | None = None
    # Pods wearing the engine's labels that its serving workload did not create (observe/lineage.py): they feed
    # no decision, and Degraded names them.
    foreign_pods: tuple[str, ...] = ()
    # A canary retune (autotune/canary.py): the <name>-kvpilot-canary Deployment, and the windows of its pod and of the
    # other pods over the same interval (None: none, or no canary runs).
    canary_deployment: DeploymentState | None = None
    canary_kv: KvWindow | None = None
    others_kv: KvWindow | None = None
    canary_name_taken: bool = False  # <name>-kvpilot-canary exists and is not the engine's: no canary starts


def job_state(job: dict[str, Any], pod_message: str = "", unschedulable: str | None = None) -> JobState:
    """Reduce a batch/v1 Job (and its pod's termination message) to a JobState."""
    status = job.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = "Failed" in conds
    message = pod_message
    if failed and not message:
        c = conds["Failed"]
        message = f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
    return JobState(
        name=job["metadata"]["name"],
        active="Complete" not in conds and not failed,
        succeeded="Complete" in conds,
        failed=failed,
        message=message,
        start_time=status.get("startTime"),
        completion_time=status.get("completionTime"),
        owner_uids=tuple(o.get("uid", "") for o in job["metadata"].get("ownerReferences") or []),
        unschedulable_message=unschedulable,
        failed_at=conds["Failed"].get("lastTransitionTime") if failed else None,
    )


def deployment_state(dep: dict[str, Any]) -> DeploymentState:
    st = dep.get("status") or {}
    annotations = dep["spec"]["template"]["metadata"].get("annotations") or {}
    conds = st.get("conditions") or []
    return DeploymentState(
        generation=dep["metadata"].get("generation", 0),
        observed_generation=st.get("observedGeneration", 0),
        replicas=dep["spec"].get("replicas", 1),
        updated_replicas=st.get("updatedReplicas", 0),
        ready_replicas=st.get("readyReplicas", 0),
        available_replicas=st.get("availableReplicas", 0),
        progress_deadline_exceeded=any(
            c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded" for c in conds
        ),
        fingerprint=annotations.get(L.FINGERPRINT_ANNOTATION),
        max_batch_size=annotations.get(L.BATCH_ANNOTATION),
        config_hash=annotations.get(L.CONFIG_HASH_ANNOTATION),
        pods=st.get("replicas", 0),
        image=_server_image(dep),
        rolling_update=_int_limits(dep),
    )


def _server_image(dep: dict[str, Any]) -> str | None:
    containers = ((dep["spec"]["template"].get("spec") or {}).get("containers")) or []
    first = containers[0] if containers and isinstance(containers[0], dict) else {}
    image = first.get("image")
    return image if isinstance(image, str) else None


def _int_limits(dep: dict[str, Any]) -> tuple[int, int] | None:
    limits = (dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    surge, unavailable = limits.get("maxSurge"), limits.get("maxUnavailable")
    if type(surge) is int and type(unavailable) is int:  # not a bool, not a percentage
        return surge, unavailable
    return None


def pod_state(pod: dict[str, Any]) -> PodState:
    st = pod.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    sched = conds.get("PodScheduled")
    unschedulable = None
    if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
        unschedulable = sched.get("message", "")
    waiting_reason = waiting_message = last_exit = None
    restarts = 0
    for cs in st.get("containerStatuses") or []:
        restarts += cs.get("restartCount", 0)
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            waiting_reason, waiting_message = waiting.get("reason"), waiting.get("message")
            last_exit = _last_exit(cs) or last_exit
    annotations = pod["metadata"].get("annotations") or {}
    ready_cond = conds.get("Ready", {})
    ready_after = None
    started = [((cs.get("state") or {}).get("running") or {}).get("startedAt") for cs in st.get("containerStatuses") or []]
    # Only a pod that became Ready once, from its first container start, measures a restart's cost: a later
    # readiness flap or container restart would make the "startup" the pod's whole age.
    if ready_cond.get("status") == "True" and restarts == 0 and started and started[0] \
            and ready_cond.get("lastTransitionTime"):
        ready_after = max(0.0, (_ts(ready_cond["lastTransitionTime"]) - _ts(started[0])).total_seconds())
    return PodState(
        name=pod["metadata"]["name"],
        ready=conds.get("Ready", {}).get("status") == "True",
        fingerprint=annotations.get(L.FINGERPRINT_ANNOTATION),
        unschedulable_message=unschedulable,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        restarts=restarts,
        ip=st.get("podIP"),
        started_at=st.get("startTime"),
        deleting=bool(pod["metadata"].get("deletionTimestamp")),
        ready_after_s=ready_after,
        last_exit=last_exit,
        canary=(pod["metadata"].get("labels") or {}).get(L.CANARY_LABEL) == "true",
        max_batch_size=annotations.get(L.BATCH_ANNOTATION),
    )


def _last_exit(container_status: dict[str, Any]) -> str | None:
    """"exit code N (Reason): message" of the container's last termination, None without one."""
    ended = ((container_status.get("lastState") or {}).get("terminated")
             or (container_status.get("state") or {}).get("terminated"))
    if not isinstance(ended, dict):
        return None
    reason = f" ({ended['reason']})" if ended.get("reason") else ""
    message = str(ended.get("message") or "").strip()
    return f"exit code {ended.get('exitCode', '?')}{reason}" + (f": {message}" if message else "")


def _ts(value: str) -> datetime:
    return parse_rfc3339(value)


def startup_seconds(pods: tuple[PodState, ...]) -> float | None:
    """The slowest observed start-to-Ready among the pods: the restart cost the tuner must weigh."""
    values = [p.ready_after_s for p in pods if p.ready_after_s is not None]
    return max(values) if values else None
