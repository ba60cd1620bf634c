"""What a multi-node engine's LeaderWorkerSet and its pods say, as the plan's decisions read it.

``lws_state`` reduces the LeaderWorkerSet to the ``DeploymentState`` the conditions and rollout logic already
reason about, counted in groups (LWS status: ``replicas`` groups created, ``updatedReplicas``,
``readyReplicas`` groups whose pods are all Ready; it has no progress deadline). ``groups_status`` is
``status.groups``: ready groups, pods per group, and a group recreated as one (RecreateGroupOnPodRestart),
noticed as a leader pod with a new UID under the same template revision (a rollout changes the revision).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kvpilot.api.status import GroupRecreation, GroupsStatus
from kvpilot.api.timestamps import rfc3339
from kvpilot.desired import labels as L
from kvpilot.desired.lws_pods import GroupPod
from kvpilot.desired.observed import DeploymentState

MAX_GROUPS = 1000  # serving.replicas' maximum


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def lws_state(lws: dict[str, Any]) -> DeploymentState:
    """The LeaderWorkerSet as a DeploymentState whose replicas are groups."""
    spec, st = lws.get("spec") or {}, lws.get("status") or {}
    leader = ((spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate")) or {}
    annotations = (leader.get("metadata") or {}).get("annotations") or {}
    containers = (leader.get("spec") or {}).get("containers") or [{}]
    limits = ((spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration")) or {}
    surge, unavailable = limits.get("maxSurge"), limits.get("maxUnavailable")
    ready = _int(st.get("readyReplicas"))
    return DeploymentState(
        generation=_int(lws.get("metadata", {}).get("generation")),
        observed_generation=_int(st.get("observedGeneration")),
        replicas=_int(spec.get("replicas"), 1),
        updated_replicas=_int(st.get("updatedReplicas")),
        ready_replicas=ready,
        available_replicas=ready,  # a group serves once all its pods are Ready
        progress_deadline_exceeded=False,
        fingerprint=annotations.get(L.FINGERPRINT_ANNOTATION),
        max_batch_size=annotations.get(L.BATCH_ANNOTATION),
        config_hash=annotations.get(L.CONFIG_HASH_ANNOTATION),
        pods=_int(st.get("replicas")),
        image=containers[0].get("image") if isinstance(containers[0], dict) else None,
        rolling_update=(surge, unavailable) if type(surge) is int and type(unavailable) is int else None,
    )


def _recreated(previous: tuple[str, ...], leaders: list[str]) -> int | None:
    """The first group whose leader is a new pod of the same template revision (not a rollout)."""
    for group, (was, now) in enumerate(zip(previous, leaders)):
        if not was or not now or was == now:
            continue
        old_uid, _, old_rev = was.partition(":")
        new_uid, _, new_rev = now.partition(":")
        if old_uid != new_uid and old_rev == new_rev:
            return group
    return None


def groups_status(state: DeploymentState | None, pods: list[GroupPod], size: int,
                  previous: GroupsStatus | None, now: datetime) -> GroupsStatus:
    """``status.groups`` from the LeaderWorkerSet's state and the group pods of this pass."""
    groups = state.replicas if state else 0
    ready = state.ready_replicas if state else 0
    live = [p for p in pods if not p.deleting]
    before = previous.leaders or () if previous else ()
    count = min(max(groups, max((p.group + 1 for p in live), default=0)), MAX_GROUPS)
    # A group between its old and its new leader keeps the old one, so the new one is noticed when it comes.
    leaders = [before[g] if g < len(before) else "" for g in range(count)]
    for pod in live:
        if pod.worker == 0 and pod.group < len(leaders):
            leaders[pod.group] = f"{pod.uid}:{pod.revision}"
    last = previous.last_recreation if previous else None
    group = _recreated(before, leaders)
    if group is not None:
        in_group = [p for p in live if p.group == group]
        last = GroupRecreation(group=group, at=rfc3339(now), message=(
            f"Group {group} was recreated as one (LeaderWorkerSet restartPolicy RecreateGroupOnPodRestart): one of "
            f"its pods was deleted or a container of it restarted, so all {size} of its pods were replaced; "
            f"{sum(p.ready for p in in_group)}/{size} Ready when seen"))
    return GroupsStatus(
        replicas=groups,
        ready=ready,
        pods_per_group=size,
        ready_pods=sum(p.ready for p in live),
        summary=f"{ready}/{groups}",
        leaders=tuple(leaders),
        last_recreation=last,
    )
