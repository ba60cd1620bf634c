"""Arrival burstiness from per-sample arrival counts (autotune/burst.py), its live counting (the sampler), and the
what-if's use of it (autotune/whatif.py draws kvsim's gamma gaps with the fitted cv)."""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from kvsim.workload import Phase

from kvpilot.autotune.replay import TrafficFit, fit_traffic, quantized
from kvpilot.autotune.replay import replayed_requests as _requests
from kvpilot.autotune.whatif import Engine, steady_goodput
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.autotune.burst import CV_MAX, CV_MIN, allan_factor, arrival_cv, equal_periods, fleet_arrivals
from kvpilot.observe.scrape import EngineFacts, EngineSampler
from kvpilot.autotune.summarize import summarize
from tests.unit.helpers import engine

PERIOD_S, HISTORY = 5.0, 60  # the live sampler's period at a 30 s interval, and its 5-minute history


def counts(cv: float, rate: float, seed: int, m: int = HISTORY, period: float = PERIOD_S) -> list[float | None]:
    """Arrivals per period of a stationary renewal stream drawn by kvsim's own generator (gamma, or Poisson)."""
    rng = random.Random(seed)
    phase = Phase(1e9, "poisson" if cv == 1.0 else "gamma", rate, cv)
    t = 0.0
    for _ in range(500):  # forget the start: the counts are those of a stream in progress
        t += phase.next_gap(rng, rate)
    start, out = t, [0.0] * m
    while True:
        t += phase.next_gap(rng, rate)
        i = int((t - start) // period)
        if i >= m:
            return list(out)
        out[i] += 1


def test_poisson_counts_read_as_cv_1() -> None:
    # Z = 2 standard errors: about 5% of Poisson histories fall outside the band (two-sided, heavier tail than
    # a normal's); inside it the estimate is exactly 1 (the what-if then replays the very Poisson stream).
    estimates = [arrival_cv(counts(1.0, 8.0, seed)) for seed in range(100)]
    assert all(e is not None and 0.6 <= e <= 1.5 for e in estimates), estimates
    assert sum(1 for e in estimates if e == 1.0) >= 85


def test_gamma_cv_3_reads_near_3() -> None:
    # 59 differences: the Allan factor's relative standard error is ~sqrt(2/59) = 18% for normal counts, more for
    # gamma's skewed ones; cv = sqrt(A) halves it. Over 300 histories the 5th-95th percentiles were 2.41-3.54, so
    # each history within [2.0, 4.0] and the median within 3 +/- 0.3 (its own error is ~3%).
    estimates = [arrival_cv(counts(3.0, 8.0, seed)) for seed in range(40)]
    assert all(e is not None and 2.0 <= e <= CV_MAX for e in estimates), estimates
    assert statistics.median(e for e in estimates if e is not None) == pytest.approx(3.0, abs=0.3)


def test_moderate_burstiness_and_regular_traffic_are_told_apart() -> None:
    two = statistics.median(arrival_cv(counts(2.0, 8.0, seed)) or 0 for seed in range(20))
    assert two == pytest.approx(2.0, abs=0.25)
    regular = statistics.median(arrival_cv(counts(0.5, 8.0, seed)) or 0 for seed in range(20))
    assert regular == pytest.approx(0.5, abs=0.1)


def test_a_rate_step_is_not_burstiness() -> None:
    # Poisson at 12 then 20 req/s: the plain index of dispersion would read ~6 (the two rates' spread), the Allan
    # factor sees one squared step among 59 differences.
    steady = counts(1.0, 12.0, 1, m=30) + counts(1.0, 20.0, 2, m=30)
    mean = statistics.mean(c for c in steady if c is not None)
    assert statistics.pvariance([c for c in steady if c is not None]) / mean > 3
    assert arrival_cv(steady) == 1.0


def test_thin_evidence_gives_no_estimate() -> None:
    assert arrival_cv([]) is None
    assert arrival_cv(counts(3.0, 8.0, 1, m=8)) is None  # 7 differences
    assert arrival_cv(counts(3.0, 0.3, 1)) is None  # 1.5 arrivals per sample: every process looks Poisson
    assert arrival_cv([0.0] * 60) is None  # no arrivals at all
    assert arrival_cv([None] * 60) is None


def test_hostile_counts_never_crash_nor_read_absurd() -> None:
    base = counts(1.0, 8.0, 3)
    odd: list[float | None] = [math.nan, math.inf, -math.inf, -5.0, 1e300, 1e8, None]
    for bad in odd:
        spoiled = list(base)
        for k in range(0, 60, 7):
            spoiled[k] = bad
        cv = arrival_cv(spoiled)
        assert cv is not None and CV_MIN <= cv <= CV_MAX, (bad, cv)
        assert cv == arrival_cv([c if k % 7 else None for k, c in enumerate(base)])  # dropped, chain broken
    glitch = list(base)
    glitch[30] = 1e6  # a counter that jumped: within MAX_COUNT, so it counts, but the cv is clamped
    assert arrival_cv(glitch) == CV_MAX
    assert arrival_cv([1e300, 1e300] * 30) is None
    stats = allan_factor([10.0, None, 12.0, 14.0])  # the None breaks the chain: one difference, 12 -> 14
    assert stats is not None and stats[1] == 1 and stats[0] == pytest.approx(4 / (2 * 12))


def test_fleet_arrivals_are_finished_plus_growth_only_for_the_same_pods() -> None:
    before = {"a": (100.0, 4.0), "b": (50.0, 0.0)}
    after = {"a": (110.0, 6.0), "b": (53.0, 1.0)}
    assert fleet_arrivals(before, after, {"a", "b"}) == 12 + 4
    assert fleet_arrivals(before, {"a": after["a"]}, {"a"}) is None  # pod b went: not a drop in traffic
    assert fleet_arrivals(before, after, {"a", "b", "c"}) is None  # pod c answered nothing
    assert fleet_arrivals(before, {**after, "a": (3.0, 0.0)}, {"a", "b"}) is None  # a's counter reset
    assert fleet_arrivals(before, {**after, "a": (math.nan, 0.0)}, {"a", "b"}) is None
    assert fleet_arrivals({}, {}, set()) is None


def test_late_samples_do_not_count_as_equal_periods() -> None:
    assert equal_periods([(5.0, 10.0), (5.1, 11.0), (9.0, 30.0), (4.9, None)]) == [10.0, 11.0, None, None]
    assert equal_periods([]) == []


def stats_reply(active: int, queued: int, finished: int = 0) -> bytes:
    return json.dumps([{"numActiveRequests": active, "numQueuedRequests": queued, "maxBatchSizeStatic": 64,
                        "maxBatchSizeRuntime": 16, "iterLatencyMS": 7.0, "numCompletedRequests": finished,
                        "kvCacheStats": {"usedNumBlocks": 10, "maxNumBlocks": 100, "tokensPerBlock": 32},
                        "inflightBatchingStats": {"numPausedRequests": 0, "numContextRequests": 1,
                                                  "numGenRequests": 2}}]).encode()


def prom_reply(done: float) -> bytes:
    return (f'# TYPE trtllm_request_success counter\n'
            f'trtllm_request_success_total{{model_name="m",finished_reason="stop"}} {done}\n').encode()


@pytest.mark.parametrize("counter", [True, False], ids=["request-counter", "iteration-stats-only"])
def test_the_sampler_counts_each_samples_arrivals_and_the_window_carries_the_cv(counter: bool) -> None:
    """Two pods serving a bursty stream: what each /metrics and /prometheus/metrics read says (counter of
    finished requests, requests in the pod) gives back the true arrivals per sample, and the window's cv. Without
    a Prometheus page (1.2's TensorRT backend) the iteration stats' finished requests count instead."""
    truth = counts(3.0, 8.0, 5, m=61)
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    facts = EngineFacts(tokens_per_block=32, max_batch_size_ceiling=64)
    done = {"a": 0.0, "b": 0.0}
    in_pod = {"a": 0, "b": 0}
    for k, arrived in enumerate(truth):
        n = int(arrived or 0)
        to_a = n // 2
        for pod, share in (("a", to_a), ("b", n - to_a)):
            finished = max(0, in_pod[pod] + share - 3)  # each pod keeps up to 3 requests in flight
            in_pod[pod] += share - finished
            done[pod] += finished
            sampler.accept(pod, clock[0], stats_reply(min(in_pod[pod], 2), max(0, in_pod[pod] - 2), finished),
                           prom_reply(done[pod]) if counter else None, facts)
        sampler.count_arrivals(clock[0], {"a", "b"})
        clock[0] += PERIOD_S + (0.2 if k % 2 else -0.2)  # scheduling jitter: still equal periods
    seen = [c for _, _, c in sampler.arrivals]
    assert seen == truth[1:]  # the first sample has nothing before it
    window = sampler.window(30)
    assert window is not None and window.arrival_cv == arrival_cv(truth[1:]) and window.arrival_cv is not None
    assert 2.0 <= window.arrival_cv <= CV_MAX
    # A pod that does not answer breaks the chain instead of reading as a drop of the traffic.
    sampler.accept("a", clock[0], stats_reply(0, 0, 4), prom_reply(done["a"] + 4) if counter else None, facts)
    sampler.count_arrivals(clock[0], {"a", "b"})
    assert sampler.arrivals[-1][2] is None
    sampler.reset()  # a rollout: the traffic history is kept (it does not depend on the configuration)
    assert len(sampler.arrivals) == len(truth)


def test_summarize_fills_the_cv_only_with_counts() -> None:
    from kvpilot.trtllm.metrics import parse_iteration_stats

    samples = {"a": parse_iteration_stats(json.loads(stats_reply(2, 0)), 1000.0)}
    assert summarize(samples, window_seconds=30).arrival_cv is None  # type: ignore[union-attr]
    w = summarize(samples, window_seconds=30, arrival_counts=counts(3.0, 8.0, 2))
    assert w is not None and w.arrival_cv is not None and w.arrival_cv > 2


A100 = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict", replicas=2,
              restart_seconds=90.0, surge=False, ttft_ms=3000.0, tpot_ms=60.0, queue_timeout_s=1.5)


def window(cv: float | None) -> KvWindow:
    return KvWindow(samples=10, pods=2, peak_utilization=0.3, mean_utilization=0.3, peak_used_blocks=100,
                    max_blocks=14000, tokens_per_block=32, peak_active=64, mean_active=64, peak_queued=10,
                    mean_queued=5, paused=0, runtime_batch_size=64, arrival_rate=5.0, prompt_mean=150,
                    output_mean=600, length_share=0.2227, arrival_cv=cv)


def gap_cv(fit: TrafficFit) -> float:
    arrivals = [r.arrival_s for r in _requests(fit, 2000.0)]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return statistics.pstdev(gaps) / statistics.mean(gaps)


def test_the_fit_carries_the_cv_and_falls_back_to_poisson() -> None:
    fit = fit_traffic(window(2.9))
    assert fit is not None and fit.arrival_cv == 2.9
    assert quantized(fit).arrival_cv == 3.0
    for unknown in (None, math.nan, -1.0, 0.0):
        poisson = fit_traffic(window(unknown))
        assert poisson is not None and poisson.arrival_cv == 1.0


def test_the_what_if_draws_gaps_with_the_fitted_cv_and_poisson_is_unchanged() -> None:
    bursty = TrafficFit(rate_per_s=4.0, prompt_mean=150, output_mean=300, max_tokens=1024, arrival_cv=3.0)
    assert gap_cv(bursty) == pytest.approx(3.0, rel=0.15)  # ~8000 gaps
    poisson = replace(bursty, arrival_cv=1.0)
    assert gap_cv(poisson) == pytest.approx(1.0, rel=0.05)
    # cv 1 replays exactly the stream the what-if drew before it fitted burstiness (rng.expovariate).
    rng = random.Random(8)
    t, expected = 0.0, []
    for _ in range(50):
        t += rng.expovariate(4.0)
        expected.append(t)
        rng.lognormvariate(0, 1), rng.lognormvariate(0, 1)  # the two lengths drawn per request
    assert [r.arrival_s for r in _requests(poisson, 1e9)][:50] == pytest.approx(expected)


def test_bursty_traffic_serves_less_in_time_under_a_tight_ttft() -> None:
    # Under a 500 ms TTFT objective (the gateway sheds after 250 ms), cv 3 arrivals come in clusters whose
    # prefills queue behind each other, so the same mean rate serves ~18% less in time; under a 3 s objective at
    # the suite's burst-a100 load the batch absorbs the clusters and burstiness costs nothing (as the suite's
    # burst-a100 case measures: every limit serves it all).
    tight = replace(A100, ttft_ms=500.0, queue_timeout_s=0.25)
    poisson = TrafficFit(rate_per_s=10.0, prompt_mean=800, output_mean=500, max_tokens=1024)
    bursty = replace(poisson, arrival_cv=3.0)
    assert steady_goodput(tight, bursty, 64, 2000) < 0.9 * steady_goodput(tight, poisson, 64, 2000)
    light = TrafficFit(rate_per_s=8.0, prompt_mean=800, output_mean=300, max_tokens=1024)
    assert steady_goodput(A100, replace(light, arrival_cv=3.0), 64, 2000) == pytest.approx(
        steady_goodput(A100, light, 64, 2000), rel=0.05)


def test_status_shows_the_cv() -> None:
    for cv, shown in ((2.904, "2.90"), (None, None)):
        p = plan(engine(), Observed(claim_phase="Bound", kv=window(cv)), Settings(),
                 datetime(2026, 1, 1, tzinfo=timezone.utc))
        assert p.status.kv_cache is not None and p.status.kv_cache.traffic is not None
        assert p.status.kv_cache.traffic.arrival_cv == shown


def test_a_pod_switching_between_counter_and_iteration_stats_is_no_count() -> None:
    sampler = EngineSampler(clock=lambda: 0.0)
    facts = EngineFacts(tokens_per_block=32, max_batch_size_ceiling=64)
    for k, prom in enumerate([prom_reply(1000.0), prom_reply(1010.0), None, None, None]):
        sampler.accept("a", 5.0 * k, stats_reply(1, 0, 10), prom, facts)
        sampler.count_arrivals(5.0 * k, {"a"})
    # counter 1000 -> 1010: 10; the switch to iteration sums (another origin) is no count, nor is the next
    # sample (nothing to compare it with); then iteration sums: 10 per sample.
    assert [c for _, _, c in sampler.arrivals] == [10.0, None, None, 10.0]
