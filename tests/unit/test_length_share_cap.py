"""The what-if places the requests' max_tokens from the share of outputs that stopped at it (the pods' request
counter's ``finished_reason="length"`` series), since no TensorRT-LLM release exports the cap itself
(autotune/capped.py cap_from_length_share; trtllm/metrics.py, autotune/summarize.py, bench/window.py)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from kvpilot.autotune.capped import MAX_CAP_FACTOR, OUTPUT_SIGMA, cap_from_length_share
from kvpilot.autotune.replay import TrafficFit, fit_traffic, quantized
from kvpilot.autotune.shift import SeenTraffic
from kvpilot.autotune.summarize import MIN_TRAFFIC_REQUESTS, traffic_fit
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, MetricsRejected, parse_prometheus
from tests.unit.test_autotune_whatif import window


def cut_outputs(mean: float, median: float, cap: int, n: int, seed: int = 11) -> list[int]:
    """Outputs as kvsim's workloads draw them (lognormal from mean and median), cut at ``cap``."""
    rng = random.Random(seed)
    sigma = math.sqrt(2 * math.log(mean / median))
    return [min(cap, max(1, round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(n)]


@pytest.mark.parametrize(("mean", "median"), [(600, 450), (300, 220), (250, 180), (300, 200), (400, 300)])
def test_the_suite_outputs_place_their_cap_within_an_eighth(mean: float, median: float) -> None:
    """Every output distribution of the suite (spread 0.76-0.90 where the what-if draws with 0.8), cap 1024, as a
    window of many requests shows it: the placed cap is within 12% of the true one."""
    outputs = cut_outputs(mean, median, 1024, 20_000)
    share = sum(1 for x in outputs if x >= 1024) / len(outputs)
    cap = cap_from_length_share(statistics.fmean(outputs), share, OUTPUT_SIGMA)
    assert cap == pytest.approx(1024, rel=0.12)


def test_one_window_of_requests_places_the_long_output_cap() -> None:
    """One 30 s window of the long-output case (~900 finished requests at 30 req/s)."""
    caps = []
    for seed in range(10):
        outputs = cut_outputs(600, 450, 1024, 900, seed)
        share = sum(1 for x in outputs if x >= 1024) / len(outputs)
        caps.append(cap_from_length_share(statistics.fmean(outputs), share, OUTPUT_SIGMA))
    assert all(900 <= c <= 1200 for c in caps), caps


def test_a_larger_share_cut_means_a_lower_cap() -> None:
    caps = [cap_from_length_share(400.0, share, OUTPUT_SIGMA) for share in (0.01, 0.05, 0.1, 0.3, 0.6, 0.9)]
    assert caps == sorted(caps, reverse=True) and len(set(caps)) == len(caps)
    assert all(c > 400 for c in caps)  # a cap some outputs stopped at is above their mean


@pytest.mark.parametrize(("share", "expected"), [
    (None, 0),  # no counter (1.2's TensorRT backend serves no Prometheus page): unknown
    (0.0, 0),  # nothing cut: the cap is somewhere above every output, unknown
    (float("nan"), 0),
    (1.0, 512),  # every output stopped at the cap (kvsim's server: the output is max_tokens): the mean is it
])
def test_the_edges(share: float | None, expected: int) -> None:
    assert cap_from_length_share(512.0, share, OUTPUT_SIGMA) == expected


def test_a_tiny_share_is_held_within_a_multiple_of_the_mean() -> None:
    """One output in a million cut: the lognormal guess would put the cap past any max_seq_len, where the
    replayed requests would all be refused. A share below the float's resolution, or a mean that is not finite,
    raises nothing."""
    assert cap_from_length_share(200.0, 1e-6, OUTPUT_SIGMA) == round(MAX_CAP_FACTOR * 200.0)
    assert cap_from_length_share(200.0, 1e-17, OUTPUT_SIGMA) == round(MAX_CAP_FACTOR * 200.0)
    assert cap_from_length_share(float("inf"), 0.1, OUTPUT_SIGMA) == 0
    assert cap_from_length_share(float("nan"), 0.1, OUTPUT_SIGMA) == 0


def test_the_what_if_replays_the_placed_cap_on_a_coarse_grid() -> None:
    fit = fit_traffic(window(12.0, output=520.0))
    assert fit is not None and fit.max_tokens > 520
    nearby = fit_traffic(window(12.0, output=523.0))
    assert nearby is not None and nearby.max_tokens != fit.max_tokens
    assert quantized(nearby).max_tokens == quantized(fit).max_tokens  # the same simulation, from the cache
    assert quantized(TrafficFit(10.0, 100.0, 100.0, 0)).max_tokens == 0  # unknown stays unknown
    for mean in (560.0, 620.0, 48.0, 1000.0):  # every output at its cap (a share of 1): the cap is the mean
        at_cap = quantized(TrafficFit(10.0, 100.0, mean, round(mean)))
        assert at_cap.max_tokens == round(at_cap.output_mean)


PAGE = """# TYPE trtllm_request_success_total counter
trtllm_request_success_total{{model_name="m",engine_type="trtllm",finished_reason="length"}} {cut}
trtllm_request_success_total{{model_name="m",engine_type="trtllm",finished_reason="stop"}} {stop}
"""


def test_the_length_series_of_the_request_counter_is_read_apart() -> None:
    _, snap = parse_prometheus(PAGE.format(cut=30, stop=70), 0.0)
    assert snap.completed == 100 and snap.length_finished == 30
    only_stop = '# TYPE request_success counter\nrequest_success_total{finished_reason="stop"} 7\n'
    _, snap = parse_prometheus(only_stop, 0.0)  # the unprefixed name (up to 1.2); no request hit its cap yet
    assert snap.completed == 7 and snap.length_finished == 0
    _, snap = parse_prometheus("# TYPE other gauge\nother 1\n", 0.0)
    assert snap.completed is None and snap.length_finished is None
    # A counter without the label (a relabelling that dropped it): the cut is unknown, not none.
    _, snap = parse_prometheus("request_success_total 100\n", 0.0)
    assert snap.completed == 100 and snap.length_finished is None
    # Another family with the label is not the request counter: its values neither count nor reject the page.
    other = PAGE.format(cut=30, stop=70) + 'odd_gauge{finished_reason="length"} -3\n'
    assert parse_prometheus(other, 0.0)[1].length_finished == 30


def test_a_negative_length_series_is_rejected() -> None:
    with pytest.raises(MetricsRejected):
        parse_prometheus(PAGE.format(cut=-5, stop=70), 0.0)


def sample(t: float, completed: int = 0) -> IterationSample:
    return IterationSample(timestamp_s=t, used_blocks=10, max_blocks=100, tokens_per_block=32, active_requests=10,
                           queued_requests=0, paused_requests=0, max_batch_size_runtime=64,
                           max_batch_size_static=64, completed_requests=completed, generation_requests=10,
                           ctx_tokens=100)


def snaps(cut: tuple[float, float], done: tuple[float, float]) -> list[LatencySnapshot]:
    return [LatencySnapshot(completed=d, length_finished=c) for c, d in zip(cut, done)]


def test_the_window_share_is_over_the_pods_that_count() -> None:
    pods = {"a": [sample(0), sample(60)], "b": [sample(0), sample(60)], "c": [sample(0), sample(60, 40)]}
    latency = {"a": snaps((10, 40), (100, 200)),  # 30 of 100 cut
               "b": snaps((0, 10), (50, 150)),  # 10 of 100
               "c": []}  # no Prometheus page: its 40 finished requests say nothing of the cut
    assert traffic_fit(pods, latency, 60.0).length_share == pytest.approx(0.2)


def test_a_pod_counts_no_more_cut_requests_than_it_finished() -> None:
    """A hostile or broken pod claiming more cut requests than it finished cannot lift the fleet's share."""
    pods = {"a": [sample(0), sample(60)], "b": [sample(0), sample(60)]}
    latency = {"a": snaps((0, 500), (0, 10)), "b": snaps((0, 0), (0, 10))}
    assert traffic_fit(pods, latency, 60.0).length_share == pytest.approx(0.5)


@pytest.mark.parametrize("latency", [
    snaps((40, 10), (100, 200)),  # the length series went back: a restarted pod
    snaps((0, 30), (500, 30)),  # the request counter went back (a restart) while the length series grew
    snaps((0, MIN_TRAFFIC_REQUESTS - 2), (0, MIN_TRAFFIC_REQUESTS - 1)),  # too few requests
    [LatencySnapshot(completed=0.0), LatencySnapshot(completed=100.0)],  # no length series known
])
def test_unknown_share_is_none_never_a_guess(latency: list[LatencySnapshot]) -> None:
    assert traffic_fit({"a": [sample(0), sample(60)]}, {"a": latency}, 60.0).length_share is None


def test_the_share_is_pooled_with_the_traffic_and_carried_in_status() -> None:
    """The share cut at max_tokens is pooled over the windows that agree, like the lengths, and carried from pass to
    pass in status.kvCache.traffic (a window of chat at 8 req/s over two pods counts ~3 requests cut at 1024 of
    ~120: alone, its share scatters by half)."""
    from kvpilot.autotune.pooling import pooled_traffic, replayed
    from kvpilot.desired.tuning import traffic_record
    from tests.unit.test_traffic_pooling import aged, documents

    first = replace(documents(), length_share=0.02)
    seen = pooled_traffic(None, first)
    assert seen is not None and seen.length_share == pytest.approx(0.02)
    record = traffic_record(seen, None)
    assert record is not None and record.stopped_at_max_tokens == "0.020000"
    assert record.max_tokens == cap_from_length_share(280.0, 0.02, OUTPUT_SIGMA)
    back = SeenTraffic.from_status(record.requests_per_minute, record.prompt_tokens, record.output_tokens, 15.0,
                                   record.requests, record.stopped_at_max_tokens)
    assert back is not None and back.length_share == pytest.approx(0.02)
    second = replace(documents(), length_share=0.04)  # as many requests: the pooled share is halfway
    pooled = pooled_traffic(aged(back), second)
    assert pooled is not None and pooled.length_share == pytest.approx(0.03, rel=0.01)
    assert replayed(aged(back), second).length_share == pytest.approx(0.03, rel=0.01)
    unknown = replace(documents(), length_share=None)  # a pass whose pods did not count it keeps the record's
    assert pooled_traffic(aged(back), unknown).length_share == pytest.approx(0.02)  # type: ignore[union-attr]
    assert traffic_record(pooled_traffic(None, unknown), None).stopped_at_max_tokens is None  # type: ignore[union-attr]


@pytest.mark.parametrize("written", ["1.5", "-0.1", "nan", "inf", "0x1p-3", 0.3, True, "9" * 40, "", "1e-17",
                                     " 0.5", "0.0000001"])
def test_a_forged_share_in_status_reads_as_none(written: object) -> None:
    seen = SeenTraffic.from_status(600, 150, 600, 15.0, 100, written)
    assert seen is not None and seen.length_share is None
