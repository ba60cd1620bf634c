"""The live window's traffic fields (arrival rate, mean prompt and output) from what trtllm-serve exposes:
the iteration stats of every release (played by kvsim, the same engine model the what-if uses) and the 1.3
token counters. autotune/summarize.traffic_fit; the what-if (autotune/replay.fit_traffic) reads them."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from kvsim import Engine, EngineConfig, Request

from kvpilot.autotune.replay import fit_traffic
from kvpilot.autotune.summarize import MIN_TRAFFIC_REQUESTS, summarize, traffic_fit
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, parse_iteration_stats, parse_prometheus

RATE, PROMPT, OUTPUT = 3.0, 600, 200
SCRAPE_S, RUN_S, WINDOW_S = 5.0, 360.0, 120.0


def play(seed: int = 3) -> tuple[list[IterationSample], list[Request]]:
    """kvsim serving Poisson traffic, its /metrics drained every SCRAPE_S as the operator's sampler does;
    returns the samples of the last WINDOW_S and the requests that arrived in it."""
    rng = random.Random(seed)
    engine = Engine(EngineConfig(profile="llama-3.1-8b-fp8-h100", build_max_batch_size=256, max_batch_size=64))
    requests, t = [], 0.0
    while t < RUN_S:
        t += rng.expovariate(RATE)
        requests.append(Request(prompt_tokens=max(1, int(rng.lognormvariate(6.2, 0.6))),
                                output_tokens=max(1, int(rng.lognormvariate(5.1, 0.6))), max_tokens=1024,
                                arrival_s=t, request_id=len(requests)))
    for r in requests:
        engine.submit(r)
    samples: list[IterationSample] = []
    scrape = SCRAPE_S
    while scrape <= RUN_S:
        engine.advance_to(scrape)
        payload = json.loads(json.dumps(engine.drain_iteration_stats()))  # the bytes a pod would send
        if scrape > RUN_S - WINDOW_S:
            samples.extend(parse_iteration_stats(payload, scrape))
        else:
            engine.drain_iteration_stats()
        scrape += SCRAPE_S
    window = [r for r in requests if RUN_S - WINDOW_S < r.arrival_s <= RUN_S]
    return samples, window


def test_iteration_stats_give_the_rate_and_lengths_kvsim_served() -> None:
    samples, arrived = play()
    w = summarize({"pod-a": samples}, window_seconds=WINDOW_S)
    assert w is not None
    true_rate = len(arrived) / WINDOW_S
    true_prompt = sum(r.prompt_tokens for r in arrived) / len(arrived)
    true_output = sum(min(r.output_tokens, 1024) for r in arrived) / len(arrived)
    assert w.arrival_rate == pytest.approx(true_rate, rel=0.15)
    assert w.prompt_mean == pytest.approx(true_prompt, rel=0.15)
    assert w.output_mean == pytest.approx(true_output, rel=0.2)
    fit = fit_traffic(w)  # the what-if now has what it needs
    assert fit is not None and fit.rate_per_s == pytest.approx(w.arrival_rate)


def test_two_pods_report_the_rate_per_pod_and_the_fleet_fit_multiplies() -> None:
    a, _ = play(seed=3)
    b, _ = play(seed=4)
    one = summarize({"pod-a": a}, window_seconds=WINDOW_S)
    both = summarize({"pod-a": a, "pod-b": b}, window_seconds=WINDOW_S)
    assert one is not None and both is not None
    assert both.arrival_rate == pytest.approx(RATE, rel=0.2)  # per pod
    fit = fit_traffic(both)
    assert fit is not None and fit.rate_per_s == pytest.approx(2 * both.arrival_rate)


def sample(t: float, active: int = 10, queued: int = 0, completed: int = 0, gen: int = 0, ctx: int = 0) -> IterationSample:
    return IterationSample(timestamp_s=t, used_blocks=10, max_blocks=100, tokens_per_block=32, active_requests=active,
                           queued_requests=queued, paused_requests=0, max_batch_size_runtime=64,
                           max_batch_size_static=256, completed_requests=completed, generation_requests=gen,
                           ctx_tokens=ctx)


def test_a_growing_queue_counts_as_arrivals() -> None:
    # 60 finished in 60 s while the queue grew by 30: 1.5 requests/s arrived, not the 1/s that was served.
    samples = [sample(0, queued=0), *[sample(i, completed=1, gen=99, ctx=500) for i in range(1, 61)], sample(61, queued=30)]
    t = traffic_fit({"p": samples}, {}, 60.0)
    assert t.arrival_rate == pytest.approx(1.5)
    assert t.prompt_mean == pytest.approx(500)
    assert t.output_mean == pytest.approx(100)


def test_the_token_counters_win_where_the_release_exports_them() -> None:
    page = """# TYPE trtllm_request_success_total counter
trtllm_request_success_total{{model_name="m",engine_type="trtllm",finished_reason="length"}} {n}
# TYPE trtllm_prompt_tokens_total counter
trtllm_prompt_tokens_total{{model_name="m",engine_type="trtllm"}} {p}
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{{model_name="m",engine_type="trtllm"}} {g}
"""
    _, before = parse_prometheus(page.format(n=100, p=40_000, g=30_000), 0.0)
    _, after = parse_prometheus(page.format(n=160, p=70_000, g=42_000), 60.0)
    assert after.prompt_tokens == 70_000 and after.generation_tokens == 42_000
    samples = [sample(0), *[sample(i, completed=1, gen=5, ctx=7) for i in range(1, 61)]]  # worse estimates
    t = traffic_fit({"p": samples}, {"p": [before, after]}, 60.0)
    assert t.arrival_rate == pytest.approx(1.0)
    assert t.prompt_mean == pytest.approx(500)
    assert t.output_mean == pytest.approx(200)


def test_1_2_pages_have_no_token_counters() -> None:
    page = """# TYPE request_success_total counter
request_success_total{model_name="m",engine_type="undefined",finished_reason="stop"} 7
"""
    _, snap = parse_prometheus(page, 0.0)
    assert snap.completed == 7 and snap.prompt_tokens is None and snap.generation_tokens is None


@pytest.mark.parametrize("samples, latency", [
    ([], {}),  # no pod
    ([sample(0), sample(1, completed=MIN_TRAFFIC_REQUESTS - 1, gen=10, ctx=10)], {}),  # too few requests
    ([sample(0, active=50), sample(60, active=0, completed=10, gen=0, ctx=0)], {}),  # nothing known of the lengths
    ([sample(0), sample(60, completed=10, gen=10, ctx=10)],
     {"p": [LatencySnapshot(completed=50.0), LatencySnapshot(completed=10.0)]}),  # a counter reset: no requests
])
def test_unknown_traffic_is_zero_never_a_guess(samples: list[IterationSample],
                                               latency: dict[str, list[LatencySnapshot]]) -> None:
    t = traffic_fit({"p": samples} if samples else {}, latency, 60.0)
    assert (t.prompt_mean == 0 or t.output_mean == 0 or t.arrival_rate == 0)
    if not samples or latency:
        assert t.arrival_rate == 0


def test_hostile_ctx_tokens_are_rejected_like_any_count() -> None:
    from kvpilot.trtllm.metrics import MetricsRejected

    with pytest.raises(MetricsRejected, match="numCtxTokens"):
        parse_iteration_stats([{"inflightBatchingStats": {"numCtxTokens": -4}}], 0.0)
    with pytest.raises(MetricsRejected, match="numCtxTokens"):
        parse_iteration_stats([{"inflightBatchingStats": {"numCtxTokens": "many"}}], 0.0)


def test_prompt_blocks_found_in_the_reuse_cache_count_as_prompt() -> None:
    # 60 requests of 500 prompt tokens, 400 of them shared: 100 computed each, 60 x 400 / 32 = 750 blocks reused.
    first = replace(sample(0), reused_blocks=1000)
    rest = [replace(sample(i, completed=1, gen=99, ctx=100), reused_blocks=1000 + round(i * 12.5)) for i in range(1, 61)]
    t = traffic_fit({"p": [first, *rest]}, {}, 60.0)
    assert t.prompt_mean == pytest.approx(500)


def test_the_prometheus_source_gets_the_traffic_from_the_1_3_series() -> None:
    from kvpilot.observe.prometheus import samples_from_matrix
    from tests.unit.test_prometheus_source import as_matrix, scrape

    def page(done: int, waiting: int) -> str:
        return scrape(100, waiting, 1, 0, done) + (
            f'# TYPE trtllm_prompt_tokens counter\ntrtllm_prompt_tokens_total{{model_name="m"}} {done * 700}\n'
            f'# TYPE trtllm_generation_tokens counter\ntrtllm_generation_tokens_total{{model_name="m"}} {done * 300}\n')

    # 60 s: 120 more finished (+1 "stop" request counted in both scrapes) and 6 more waiting.
    matrix = as_matrix("e-1", [(100.0, page(10, 0)), (130.0, page(70, 2)), (160.0, page(130, 6))])
    samples, latency = samples_from_matrix(matrix)
    w = summarize(samples, latency, window_seconds=60)
    assert w is not None
    assert w.arrival_rate == pytest.approx((120 + 6) / 60)
    assert w.prompt_mean == pytest.approx(700) and w.output_mean == pytest.approx(300)


def test_implausible_figures_from_a_hostile_pod_are_unknown() -> None:
    huge = [sample(0), *[sample(i, completed=1, gen=5, ctx=2**40) for i in range(1, 61)]]
    t = traffic_fit({"p": huge}, {}, 60.0)
    assert t.prompt_mean == 0 and t.output_mean > 0
    flood = [sample(0), sample(1, completed=2**40, gen=2**40, ctx=2**40)]
    t = traffic_fit({"p": flood}, {}, 1.0)
    assert t.arrival_rate == 0 and t.prompt_mean > 0
