"""The what-if's replayed outputs, cut at max_tokens as the pods cut them, average the measured mean
(autotune/capped.py): drawn around the measured mean and then cut, they averaged ~10% short on the suite's
long-output case, and the model served in time every request the pods served 89% of."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from kvpilot.autotune.capped import MAX_UNCUT_FACTOR, cut_mean, uncut_mean
from kvpilot.autotune.replay import TrafficFit
from kvpilot.autotune.replay import replayed_requests as _requests

SIGMA = 0.8


def drawn_and_cut(mean: float, cap: int, n: int = 100_000) -> float:
    rng = random.Random(7)
    mu = math.log(mean) - SIGMA * SIGMA / 2
    return statistics.fmean(min(cap, max(1, round(rng.lognormvariate(mu, SIGMA)))) for _ in range(n))


@pytest.mark.parametrize("measured", [50.0, 300.0, 531.0, 800.0, 1000.0])
def test_the_uncut_mean_once_cut_is_the_measured_one(measured: float) -> None:
    uncut = uncut_mean(measured, 1024, SIGMA)
    assert uncut >= measured
    assert cut_mean(uncut, 1024, SIGMA) == pytest.approx(measured, rel=1e-6)
    assert drawn_and_cut(uncut, 1024) == pytest.approx(measured, rel=0.02)  # the closed form against draws


def test_drawn_around_the_measured_mean_and_cut_the_outputs_fall_short() -> None:
    """What the replay did before: the long-output case's 531 tokens measured, drawn around 531 and cut at 1024
    (the closed form, and the draws it stands for)."""
    assert cut_mean(531.0, 1024, SIGMA) < 0.93 * 531.0
    assert drawn_and_cut(531.0, 1024) == pytest.approx(cut_mean(531.0, 1024, SIGMA), rel=0.02)


@pytest.mark.parametrize(("measured", "cap", "sigma", "expected"), [
    (600.0, 0, SIGMA, 600.0),  # no cap: nothing is cut
    (600.0, 1024, 0.0, 600.0),  # no spread: nothing is cut
    (1024.0, 1024, SIGMA, 1024 * MAX_UNCUT_FACTOR),  # every output hit the cap
    (2000.0, 1024, SIGMA, 1024 * MAX_UNCUT_FACTOR),  # more than the cap (a forged or mixed window): the cap's reach
])
def test_the_edges(measured: float, cap: int, sigma: float, expected: float) -> None:
    assert uncut_mean(measured, cap, sigma) == pytest.approx(expected)


def test_the_replay_averages_the_measured_output() -> None:
    fit = TrafficFit(rate_per_s=30.0, prompt_mean=150.0, output_mean=531.0, max_tokens=1024)
    replay = _requests(fit, 300.0)
    assert len(replay) > 5000
    assert statistics.fmean(r.output_tokens for r in replay) == pytest.approx(531.0, rel=0.03)
    assert max(r.output_tokens for r in replay) == 1024 and all(r.max_tokens == 1024 for r in replay)


def test_an_unknown_cap_replays_uncut_outputs_that_reserve_what_they_use() -> None:
    """No share of outputs cut at their cap known (fit.max_tokens 0): the outputs average the measured mean, uncut,
    and each request reserves its own output. Before, the cap was taken as the mean plus one token and the outputs cut
    there averaged ~0.7x the measured mean."""
    from kvpilot.autotune.replay import fit_traffic
    from tests.unit.test_autotune_whatif import window

    fit = fit_traffic(replace(window(15.0, output=531.0), length_share=None))
    assert fit is not None and fit.max_tokens == 0
    replay = _requests(fit, 300.0)
    assert statistics.fmean(r.output_tokens for r in replay) == pytest.approx(531.0, rel=0.03)
    assert all(r.max_tokens == r.output_tokens for r in replay)
    assert max(r.output_tokens for r in replay) > 2 * 531  # uncut: the spread is kept
