"""A raise must pay its restart back on the slower engine too (autotune/robust.paid_back): minimax regret weighs
goodput rates alone, and on the suite's ramp without a spare GPU a raise the model saw paying back over 96% of
the horizon, made 2 minutes before the run ended, ended the run 4.5% below its start."""

from __future__ import annotations

import pytest

from kvpilot.autotune.robust import paid_back

SECONDS = 1620.0  # the horizon left once the rollout is done


def gains(model: dict[int, float], stay: float) -> dict[int, float]:
    return {c: (g - stay) * SECONDS for c, g in model.items()}


def test_the_ramps_raise_pays_back_in_the_model_only() -> None:
    """The figures of the ramp's decision at 1,680 s: the model gains 2.25 req/s over 1,620 s (3,645 requests)
    against 3,515 spoiled; the slower engine gains 1.08 req/s (1,750) against 2,881."""
    model, stay = {119: 20.00, 128: 19.50}, 17.75
    slow = {64: 14.55, 119: 15.63, 128: 14.79}
    assert all(gains(model, stay)[c] > 3515 for c in (119,))
    assert paid_back([119, 128], gains(model, stay), 3515.0, stay, model, slow, 64) == []


@pytest.mark.parametrize(("slow_gain", "kept"), [(0.5, [256]), (0.01, []), (-1.0, [])])
def test_a_cheap_restart_needs_little_gain_on_the_slower_engine(slow_gain: float, kept: list[int]) -> None:
    """With surge a restart spoils a few seconds of traffic (here 127 requests at 7 req/s): a slower engine that
    gains half a request per second still pays it back; one that gains nothing, or loses, does not."""
    model, stay = {256: 8.0}, 7.0
    slow = {64: 5.6, 256: 5.6 + slow_gain}
    assert paid_back([256], gains(model, stay), 127.0, stay, model, slow, 64) == kept


def test_no_gain_in_the_model_keeps_nothing_and_nothing_served_spoils_nothing() -> None:
    assert paid_back([128], {128: 0.0}, 10.0, 5.0, {128: 5.0}, {64: 4.0, 128: 4.5}, 64) == []
    # staying put serves nothing in time: any gain on the slower engine pays back a restart that spoils nothing
    assert paid_back([128, 256], {128: 100.0, 256: 150.0}, 0.0, 0.0, {128: 1.0, 256: 1.5},
                     {64: 0.0, 128: 0.0, 256: 1.35}, 64) == [256]
