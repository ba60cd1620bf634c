"""serving.rollout.strategy: surge only where a spare GPU lets capacity stay up; the tuner prices what is in force."""

from __future__ import annotations

import pytest

from kvpilot.api.models import RolloutSpec
from kvpilot.desired.rollout import rolling_update, surge_in_force

SPEC_LIMITS = {"maxSurge": 0, "maxUnavailable": 1}
SURGE = {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(("strategy", "spare", "expected"), [
    ("Auto", True, SURGE),
    ("Auto", False, SPEC_LIMITS),
    ("Auto", None, SPEC_LIMITS),  # not observed: never risk a Pending surge pod
    ("Surge", False, SURGE),
    ("NoSurge", True, SPEC_LIMITS),
])
def test_rolling_update_limits(strategy: str, spare: bool | None, expected: dict[str, int]) -> None:
    rollout = RolloutSpec(max_surge=0, max_unavailable=1, strategy=strategy)
    assert rolling_update(rollout, spare) == expected
    assert surge_in_force(rollout, spare) == (expected == SURGE)


def test_explicit_limits_with_surge_count_as_surge() -> None:
    assert surge_in_force(RolloutSpec(max_surge=2, max_unavailable=0, strategy="NoSurge"), None)
