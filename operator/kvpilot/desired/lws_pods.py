"""The pods of a LeaderWorkerSet group as kvpilot reads them: group and worker index, template revision, readiness.

Kept apart from desired/groups.py so that ``Observed`` (desired/observed.py) can carry them without an import
cycle (groups.py reads ``DeploymentState`` from there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"


@dataclass(frozen=True)
class GroupPod:
    """One pod of a group (leader: worker index 0)."""

    group: int
    worker: int
    uid: str
    revision: str
    ready: bool
    deleting: bool = False


def group_pod(pod: dict[str, Any]) -> GroupPod | None:
    """A pod of a LeaderWorkerSet group, from its LWS labels; None for any other (or a malformed) pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    group, worker = labels.get(GROUP_LABEL), labels.get(WORKER_LABEL)
    if not (isinstance(group, str) and group.isdigit() and isinstance(worker, str) and worker.isdigit()):
        return None
    conds = (pod.get("status") or {}).get("conditions") or []
    ready = any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    return GroupPod(int(group), int(worker), str(meta.get("uid", "")), str(labels.get(REVISION_LABEL, "")), ready,
                    bool(meta.get("deletionTimestamp")))
