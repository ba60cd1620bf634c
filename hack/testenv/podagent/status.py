"""Pure construction of the pod status the local kubelet reports.

The operator and the Deployment/Job controllers read exactly these fields (phase, conditions,
container states, restart counts, pod IP), so they follow the kubelet's shapes and reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class ContainerStatus:
    """What the kubelet knows about one container; `state`/`last_state` use the API's ContainerState shape."""

    name: str
    image: str
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: dict = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""  # "podman://<name>" or "process://<pgid>": which runner ran it
    image_id: str = ""

    def to_api(self) -> dict:
        """The containerStatuses / initContainerStatuses entry."""
        return {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "containerID": self.container_id,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "started": self.started and "running" in self.state,
            "restartCount": self.restart_count,
        }

    @property
    def terminated(self) -> dict | None:
        """The terminated state, if the container has finished for good or is between restarts."""
        return self.state.get("terminated")


def _condition(ctype: str, ok: bool, now: str, previous: Mapping[str, Mapping], reason: str = "", message: str = "") -> dict:
    """One pod condition; lastTransitionTime only moves when the status flips."""
    status = "True" if ok else "False"
    before = previous.get(ctype)
    since = before["lastTransitionTime"] if before and before.get("status") == status else now
    cond = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": since}
    if not ok and reason:
        cond["reason"] = reason
    if not ok and message:
        cond["message"] = message
    return cond


def pod_conditions(
    phase: str,
    initialized: bool,
    containers: Sequence[ContainerStatus],
    previous: Sequence[Mapping],
    now: str,
) -> list[dict]:
    """PodScheduled, Initialized, ContainersReady and Ready, as the kubelet computes them."""
    before = {c["type"]: c for c in previous}
    unready = [c.name for c in containers if not c.ready]
    all_ready = initialized and not unready
    if phase in ("Succeeded", "Failed"):
        reason, message = ("PodCompleted" if phase == "Succeeded" else "PodFailed"), ""
    elif not initialized:
        reason, message = "ContainersNotInitialized", "containers with incomplete status: init containers"
    else:
        reason, message = "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
    init_reason = "" if phase in ("Succeeded", "Failed") else "ContainersNotInitialized"
    return [
        _condition("PodScheduled", True, now, before),
        _condition("Initialized", initialized or phase == "Succeeded", now, before, init_reason),
        _condition("ContainersReady", all_ready, now, before, reason, message),
        _condition("Ready", all_ready, now, before, reason, message),
    ]


def disagrees(published: Mapping, in_api: Mapping | None) -> bool:
    """Whether the pod's status in the API server differs from what this agent published, in phase or in any
    condition's status. Another writer does that: the node lifecycle controller marks every pod on a node whose
    heartbeat stopped (an API server outage) Ready=False and leaves ContainersReady alone (MarkPodsNotReady in
    kubernetes pkg/controller/util/node/controller_utils.go). The kubelet's status
    manager repairs it on its next periodic sync (kubelet status_manager.go, needsReconcile); so does this agent,
    or the pod stays unready for good once the node is back.

    Only what this agent writes is compared: the condition types it publishes (another writer's conditions,
    such as a readiness gate's or DisruptionTarget, are theirs) and the phase, but for a terminal phase another
    writer set (PodGC's Failed), which a kubelet never leaves either."""
    if not in_api:
        return False
    if in_api.get("phase") in ("Succeeded", "Failed") and published.get("phase") != in_api.get("phase"):
        return False
    ours = {c.get("type"): c.get("status") for c in published.get("conditions") or []}
    theirs = {c.get("type"): c.get("status") for c in in_api.get("conditions") or [] if c.get("type") in ours}
    return published.get("phase") != in_api.get("phase") or ours != theirs


def pod_phase(restart_policy: str, init_failed: bool, containers: Sequence[ContainerStatus], running: bool) -> str:
    """Pending until the containers run; Succeeded/Failed once every container has terminated for good
    (only possible for Never/OnFailure, since Always restarts everything)."""
    if init_failed:
        return "Failed"
    if not running:
        return "Pending"
    finished = [c.terminated for c in containers]
    if restart_policy != "Always" and all(t is not None for t in finished):
        codes = [int(t["exitCode"]) for t in finished if t is not None]
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"
    return "Running"


def pod_status(
    *,
    phase: str,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    conditions: list[dict],
    init_containers: Sequence[ContainerStatus],
    containers: Sequence[ContainerStatus],
    message: str = "",
    reason: str = "",
) -> dict:
    """The full `status` written through the pods/status subresource with a JSON merge patch, so the
    lists replace the previous ones wholesale and nothing stale survives."""
    status: dict = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.to_api() for c in containers],
        "initContainerStatuses": [c.to_api() for c in init_containers],
        "message": message or None,
        "reason": reason or None,
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
