"""The rolling-update limits in force: surge when spare GPUs let capacity stay up (spec.serving.rollout).

Every autotuner change is a rolling restart. Without surge (maxSurge 0, maxUnavailable 1) one pod stops before
its replacement starts, so capacity drops by 1/N for a start-to-Ready time per pod; with surge (maxSurge k,
maxUnavailable 0) each replacement is Ready before an old pod stops, so capacity never drops, but every surge
pod needs a free GPU of the pods' product (otherwise it stays Pending and the rollout stalls until the
deadline). ``Auto`` therefore surges only by as many pods as the free GPUs would place, up to every replica:
with room for all of them, the whole rollout takes one start-to-Ready time instead of one per replica, which
is most of what a retune costs (docs/tuner-suite.md). The autotuner prices a change with the result
(``surge_in_force``).
"""

from __future__ import annotations

from kvpilot.api.models import RolloutSpec

def surge_pods(rollout: RolloutSpec, room: int | None, replicas: int) -> int:
    """How many pods a rollout starts ahead of the old ones (maxSurge with maxUnavailable 0); 0: no surge.

    ``room``: how many more serving pods the free GPUs would place (None: unknown, treated as none). ``Surge``
    always surges by one (the pod waits for a GPU if none is free); ``Auto`` by what the free GPUs hold, at
    most ``replicas``; ``NoSurge`` never."""
    if rollout.strategy == "Surge":
        return 1
    if rollout.strategy == "Auto" and room:
        return max(1, min(room, replicas))
    return 0


def rolling_update(rollout: RolloutSpec, room: int | None, replicas: int) -> dict[str, int]:
    """The Deployment's ``strategy.rollingUpdate`` (see ``surge_pods`` for ``room``)."""
    surge = surge_pods(rollout, room, replicas)
    if surge:
        return {"maxSurge": surge, "maxUnavailable": 0}
    return {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable}


def surge_pods_in_force(rollout: RolloutSpec, room: int | None, replicas: int) -> int:
    """Pods a restart starts ahead of the old ones, every serving pod staying up until its replacement is
    Ready; 0 when a restart takes capacity down (the spec's own limits with maxUnavailable >= 1)."""
    limits = rolling_update(rollout, room, replicas)
    return limits["maxSurge"] if limits["maxSurge"] >= 1 and limits["maxUnavailable"] == 0 else 0
