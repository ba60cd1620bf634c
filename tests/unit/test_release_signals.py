"""The tuner gets its signals under each release's surface: Prometheus names under either spelling (1.2's
unprefixed collector, trtllm_ later), the completion rate from iteration stats whenever the request counter is
absent, and an empty latency snapshot is not latency data."""

from __future__ import annotations

import pytest

from kvpilot.autotune.summarize import summarize
from kvpilot.trtllm.metrics import LatencySnapshot, parse_iteration_stats, parse_prometheus

STATS = {"numActiveRequests": 4, "numQueuedRequests": 0, "numCompletedRequests": 3, "maxBatchSizeStatic": 64,
         "maxBatchSizeRuntime": 16, "kvCacheStats": {"usedNumBlocks": 50, "maxNumBlocks": 100, "tokensPerBlock": 32}}


def page(prefix: str, completed: float, ttft_count: float) -> str:
    """A /prometheus/metrics page as the collector of a release writes it (1.2: prefix '', 1.3: 'trtllm_')."""
    return f"""# TYPE {prefix}request_success counter
{prefix}request_success_total{{finished_reason="stop"}} {completed}
# TYPE {prefix}time_to_first_token_seconds histogram
{prefix}time_to_first_token_seconds_bucket{{le="0.1"}} {ttft_count * 0.5}
{prefix}time_to_first_token_seconds_bucket{{le="1.0"}} {ttft_count}
{prefix}time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_count}
{prefix}time_to_first_token_seconds_count {ttft_count}
{prefix}time_to_first_token_seconds_sum 1.0
"""


@pytest.mark.parametrize("prefix", ["", "trtllm_"], ids=["1.2-unprefixed", "1.3-trtllm_"])
def test_latency_and_completions_are_read_under_either_spelling(prefix: str) -> None:
    _, before = parse_prometheus(page(prefix, 10, 10), 0.0)
    _, after = parse_prometheus(page(prefix, 70, 110), 10.0)
    assert before.completed == 10 and after.completed == 70 and after.has_latency
    samples = parse_iteration_stats([STATS], 5.0)
    w = summarize({"p": samples}, {"p": [before, after]}, window_seconds=10)
    assert w is not None
    assert w.completion_rate == pytest.approx(6.0)  # (70 - 10) / 10 s, from the counter
    assert w.ttft_p95_ms is not None and 100 < w.ttft_p95_ms <= 1000


def test_completion_rate_falls_back_to_iteration_stats_without_the_counter() -> None:
    # 1.2's TensorRT backend without return_perf_metrics serves no Prometheus page: the scraper keeps nothing,
    # or a page without the counter. Either way the rate comes from numCompletedRequests, not 0.0.
    samples = parse_iteration_stats([STATS, STATS], 5.0)  # 3 + 3 completions in the window
    no_page = summarize({"p": samples}, {}, window_seconds=2)
    empty = LatencySnapshot()
    no_counter = summarize({"p": samples}, {"p": [empty, empty]}, window_seconds=2)
    assert no_page is not None and no_counter is not None
    assert no_page.completion_rate == pytest.approx(3.0) and no_counter.completion_rate == pytest.approx(3.0)


def test_the_fallback_is_per_pod() -> None:
    _, before = parse_prometheus(page("", 0, 0), 0.0)
    _, after = parse_prometheus(page("", 20, 0), 10.0)
    a, b = parse_iteration_stats([STATS], 5.0), parse_iteration_stats([STATS], 5.0)
    w = summarize({"a": a, "b": b}, {"a": [before, after]}, window_seconds=10)
    assert w is not None and w.completion_rate == pytest.approx((20 + 3) / 10 / 2)


def test_an_empty_latency_snapshot_is_not_latency_data() -> None:
    _, unprefixed_page_without_histograms = parse_prometheus("# TYPE x gauge\nx 1\n", 0.0)
    assert not unprefixed_page_without_histograms.has_latency
    w = summarize({"p": parse_iteration_stats([STATS], 1.0)},
                  {"p": [unprefixed_page_without_histograms] * 2}, window_seconds=10, slo_ttft_ms=100)
    assert w is not None and w.ttft_p95_ms is None and w.ttft_miss_fraction is None


def test_iteration_gauges_are_read_under_either_spelling() -> None:
    for prefix in ("", "trtllm_"):
        text = (f"# TYPE {prefix}kv_cache_max_blocks gauge\n{prefix}kv_cache_max_blocks 1000\n"
                f"# TYPE {prefix}kv_cache_used_blocks gauge\n{prefix}kv_cache_used_blocks 250\n"
                f"# TYPE {prefix}num_requests_running gauge\n{prefix}num_requests_running 7\n")
        sample, latency = parse_prometheus(text, 1.0)
        assert sample is not None and sample.kv_utilization == 0.25 and sample.active_requests == 7
        assert latency.completed is None and not latency.has_latency
