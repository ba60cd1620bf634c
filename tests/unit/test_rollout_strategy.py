"""serving.rollout.strategy: surge only by as many pods as spare GPUs hold; the tuner prices what is in force."""

from __future__ import annotations

import pytest

from kvpilot.api.models import RolloutSpec
from kvpilot.desired.rollout import rolling_update, surge_pods_in_force

SPEC_LIMITS = {"maxSurge": 0, "maxUnavailable": 1}


def surge(n: int) -> dict[str, int]:
    return {"maxSurge": n, "maxUnavailable": 0}


@pytest.mark.parametrize(("strategy", "room", "replicas", "expected"), [
    ("Auto", 1, 2, surge(1)),
    ("Auto", 2, 2, surge(2)),  # room for every replica: the whole rollout takes one start-to-Ready time
    ("Auto", 5, 2, surge(2)),  # never more than the replicas
    ("Auto", 0, 2, SPEC_LIMITS),
    ("Auto", None, 2, SPEC_LIMITS),  # not observed: never risk a Pending surge pod
    ("Surge", 0, 2, surge(1)),  # explicit: one pod at a time, waiting for a GPU if none is free
    ("Surge", 4, 4, surge(1)),
    ("NoSurge", 4, 2, SPEC_LIMITS),
])
def test_rolling_update_limits(strategy: str, room: int | None, replicas: int, expected: dict[str, int]) -> None:
    rollout = RolloutSpec(max_surge=0, max_unavailable=1, strategy=strategy)
    assert rolling_update(rollout, room, replicas) == expected
    assert surge_pods_in_force(rollout, room, replicas) == (expected["maxSurge"] if expected["maxUnavailable"] == 0 else 0)


def test_explicit_limits_with_surge_count_as_surge() -> None:
    assert surge_pods_in_force(RolloutSpec(max_surge=2, max_unavailable=0, strategy="NoSurge"), None, 3) == 2
    assert surge_pods_in_force(RolloutSpec(max_surge=2, max_unavailable=1, strategy="NoSurge"), None, 3) == 0
