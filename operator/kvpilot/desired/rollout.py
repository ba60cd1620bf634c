"""The rolling-update limits in force: surge when a spare GPU lets capacity stay up (spec.serving.rollout).

Every autotuner change is a rolling restart. Without surge (maxSurge 0, maxUnavailable 1) one pod stops before
its replacement starts, so capacity drops by 1/N for a start-to-Ready time per pod; with surge (maxSurge 1,
maxUnavailable 0) the replacement is Ready first and capacity never drops, but it needs a free GPU of the
pods' product (otherwise the surge pod stays Pending and the rollout stalls until the deadline). ``Auto``
therefore surges only when the cluster reports such a GPU free. The autotuner prices a change with the
result (``surge_in_force``).
"""

from __future__ import annotations

from kvpilot.api.models import RolloutSpec

SURGE = {"maxSurge": 1, "maxUnavailable": 0}


def rolling_update(rollout: RolloutSpec, spare_gpu: bool | None) -> dict[str, int]:
    """The Deployment's ``strategy.rollingUpdate``. ``spare_gpu``: whether a GPU of the pods' product is free
    for one more pod (None: unknown, treated as no)."""
    if rollout.strategy == "Surge" or (rollout.strategy == "Auto" and spare_gpu):
        return dict(SURGE)
    return {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable}


def surge_in_force(rollout: RolloutSpec, spare_gpu: bool | None) -> bool:
    """True when a restart keeps every serving pod up until its replacement is Ready."""
    limits = rolling_update(rollout, spare_gpu)
    return limits["maxSurge"] >= 1 and limits["maxUnavailable"] == 0
