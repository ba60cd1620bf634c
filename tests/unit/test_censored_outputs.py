"""The mean output of young pods, corrected for the long requests that have not finished yet
(autotune/censored.py), and the counters the live window carries for it (autotune/summarize.py)."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from kvpilot.autotune.censored import MAX_FACTOR, finished_share, output_factor, truncation, uncensored
from kvpilot.autotune.summarize import summarize
from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot

SIGMA = 0.8


def test_the_closed_form_share_is_the_integral_it_stands_for() -> None:
    """q(x) = the mean over arrivals (uniform since the start) of P(output < x m (1 - s/age)), by quadrature."""
    cdf = NormalDist().cdf
    for log_x in (-1.0, 0.0, 0.7, 1.5, 3.0):
        n = 20000
        numeric = sum(cdf((log_x + math.log((k + 0.5) / n)) / SIGMA) for k in range(n)) / n
        assert finished_share(log_x, SIGMA) == pytest.approx(numeric, abs=2e-4)


def test_truncation_inverts_the_share_and_steady_shares_need_none() -> None:
    for log_x in (-0.5, 0.4, 1.2, 2.5):
        assert truncation(finished_share(log_x, SIGMA), SIGMA) == pytest.approx(log_x, abs=1e-6)
    assert truncation(1.0) is None and truncation(0.0) is None and truncation(float("nan")) is None


def test_old_pods_and_pods_without_the_counter_are_read_as_they_are() -> None:
    assert output_factor(0.0, 50.0) == 1.0  # no counter
    assert output_factor(10.0, 50.0) == 1.0  # too few finished to say
    assert output_factor(20_000.0, 100.0) == 1.0  # a pod that has served for a while
    assert output_factor(500.0, 0.0) == 1.0  # nothing in the pods: nothing unfinished
    assert 1.1 < output_factor(350.0, 154.0) < 1.2  # the suite's document Q&A at 60 s (docstring)
    assert output_factor(30.0, 500.0) == MAX_FACTOR  # nearly nothing finished: held at the bound


def cold_start(seed: int, age: float, rate: float = 8.0, mean: float = 300.0,
               seconds_per_token: float = 0.1) -> tuple[float, float, float]:
    """Pods that started empty, ``age`` seconds of steady traffic with lognormal outputs, each request living in
    proportion to its output: (requests finished, requests in the pods, mean output of those finished in the
    last 15 s)."""
    rng = random.Random(seed)
    mu = math.log(mean) - SIGMA * SIGMA / 2
    t, finished, inside, window = 0.0, 0, 0, []
    while True:
        t += rng.expovariate(rate)
        if t >= age:
            break
        output = rng.lognormvariate(mu, SIGMA)
        done = t + output * seconds_per_token
        if done <= age:
            finished += 1
            if done > age - 15.0:
                window.append(output)
        else:
            inside += 1
    return finished, inside, sum(window) / len(window)


@pytest.mark.parametrize("age", [40.0, 60.0, 90.0])
def test_the_corrected_mean_is_the_traffics_where_the_window_reads_short(age: float) -> None:
    """Under the model's own assumptions (steady arrivals into empty pods, lifetimes in proportion to outputs):
    the window's finished outputs read short, and corrected they read the traffic's mean within 12%, over 20
    seeds."""
    raw, fixed = [], []
    for seed in range(20):
        finished, inside, window_mean = cold_start(seed, age)
        raw.append(window_mean)
        fixed.append(window_mean * output_factor(finished, inside))
    assert sum(raw) / len(raw) < 0.9 * 300.0
    assert sum(fixed) / len(fixed) == pytest.approx(300.0, rel=0.12)


def test_the_window_the_what_if_reads_is_scaled_and_says_so() -> None:
    w = KvWindow(samples=6, pods=2, peak_utilization=0.2, mean_utilization=0.1, peak_used_blocks=10, max_blocks=100,
                 tokens_per_block=32, peak_active=80, mean_active=78.0, peak_queued=0, mean_queued=0.0, paused=0,
                 runtime_batch_size=2048, output_mean=197.0, finished_total=350.0, in_pods=154.0)
    scaled, note = uncensored(w, w)
    assert scaled.output_mean == pytest.approx(197.0 * output_factor(350.0, 154.0))
    assert note is not None and "69%" in note and "197" in note
    old = KvWindow(**{**w.__dict__, "finished_total": 20_000.0})
    assert uncensored(old, old) == (old, None)


def sample(t: float, active: int, queued: int = 0) -> IterationSample:
    return IterationSample(timestamp_s=t, used_blocks=10, max_blocks=100, tokens_per_block=32, active_requests=active,
                           queued_requests=queued, paused_requests=0, max_batch_size_runtime=64,
                           max_batch_size_static=256)


def test_the_live_window_counts_since_the_pods_started_only_where_every_pod_has_the_counter() -> None:
    samples = {"a": [sample(0.0, 10), sample(15.0, 30, 2)], "b": [sample(0.0, 5), sample(15.0, 20)]}
    counters = {"a": [LatencySnapshot(completed=100.0), LatencySnapshot(completed=140.0)],
                "b": [LatencySnapshot(completed=50.0), LatencySnapshot(completed=75.0)]}
    w = summarize(samples, counters, window_seconds=15.0)
    assert w is not None and w.finished_total == 215.0 and w.in_pods == 52.0
    partial = summarize(samples, {"a": counters["a"]}, window_seconds=15.0)
    assert partial is not None and partial.finished_total == 0.0 and partial.in_pods == 0.0


def test_a_cap_the_finished_requests_could_reach_bounds_them_not_the_pods_age() -> None:
    """Chat at 2048 105 s into the run (the guard's docstring): 71% finished, but a finished output could be
    ~1,800 tokens long, past a max_tokens that 14% of them stopped at. Without a share (no cap placed) it is
    scaled; with the share, read as it is."""
    base = dict(samples=6, pods=2, peak_utilization=0.4, mean_utilization=0.3, peak_used_blocks=40, max_blocks=100,
                tokens_per_block=32, peak_active=500, mean_active=450.0, peak_queued=0, mean_queued=0.0, paused=0,
                runtime_batch_size=2048, output_mean=475.0, finished_total=2236.0, in_pods=914.0)
    unknown = KvWindow(**base)  # type: ignore[arg-type]
    scaled, note = uncensored(unknown, unknown)
    assert note is not None and scaled.output_mean > 1.1 * 475.0
    capped = KvWindow(**{**base, "length_share": 0.14})  # type: ignore[arg-type]
    assert uncensored(capped, capped) == (capped, None)
