"""Parsing trtllm-serve's /metrics (iteration stats JSON) and /prometheus/metrics, and the window summary."""

from __future__ import annotations

import pytest

from kvpilot.autotune.summarize import summarize
from kvpilot.trtllm.metrics import Histogram, parse_iteration_stats, parse_prometheus, window_quantile

# Shape from NVIDIA's trtllm-serve docs (trtllm-serve.rst), trimmed.
STATS = [{
    "gpuMemUsage": 76665782272, "iter": 154, "iterLatencyMS": 7.0, "numActiveRequests": 3, "numQueuedRequests": 2,
    "maxBatchSizeRuntime": 64, "maxBatchSizeStatic": 512, "maxBatchSizeTunerRecommended": 256,
    "kvCacheStats": {"freeNumBlocks": 101253, "maxNumBlocks": 101256, "usedNumBlocks": 3, "tokensPerBlock": 32},
    "inflightBatchingStats": {"numPausedRequests": 1, "numContextRequests": 1, "numGenRequests": 2},
}]

PROM = """# HELP trtllm_kv_cache_max_blocks x
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{model_name="m"} 1000
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{model_name="m"} 250
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="m"} 12
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="m"} 4
# TYPE trtllm_time_per_output_token_seconds histogram
trtllm_time_per_output_token_seconds_bucket{le="0.01"} 10
trtllm_time_per_output_token_seconds_bucket{le="0.05"} 90
trtllm_time_per_output_token_seconds_bucket{le="+Inf"} 100
trtllm_time_per_output_token_seconds_count 100
trtllm_time_per_output_token_seconds_sum 3.0
"""


def test_iteration_stats_fields() -> None:
    (s,) = parse_iteration_stats(STATS, 100.0)
    assert (s.used_blocks, s.max_blocks, s.tokens_per_block) == (3, 101256, 32)
    assert (s.active_requests, s.queued_requests, s.paused_requests) == (3, 2, 1)
    assert (s.max_batch_size_runtime, s.max_batch_size_static, s.tuner_recommended) == (64, 512, 256)
    assert s.kv_utilization == pytest.approx(3 / 101256)


def test_idle_server_returns_nothing_and_garbage_is_an_error() -> None:
    assert parse_iteration_stats([], 0) == []
    with pytest.raises(ValueError):
        parse_iteration_stats({"detail": "Not Found"}, 0)


def test_prometheus_gauges_and_histograms() -> None:
    sample, latency = parse_prometheus(PROM, 5.0)
    assert sample is not None and sample.kv_utilization == 0.25
    assert (sample.active_requests, sample.queued_requests) == (12, 4)
    assert latency.tpot.count == 100


def test_window_quantile_interpolates_between_scrapes() -> None:
    before = Histogram(((0.01, 0.0), (0.05, 0.0), (float("inf"), 0.0)), 0, 0)
    after = Histogram(((0.01, 10.0), (0.05, 90.0), (float("inf"), 100.0)), 100, 3)
    q50 = window_quantile(before, after, 0.5)
    assert q50 is not None and 0.01 < q50 < 0.05
    assert window_quantile(after, after, 0.5) is None  # nothing observed in between


def test_summary_reports_the_worst_pod_peak_and_the_mean() -> None:
    a = parse_iteration_stats(STATS, 1.0)
    hot = dict(STATS[0], kvCacheStats={"maxNumBlocks": 100, "usedNumBlocks": 90, "tokensPerBlock": 32})
    b = parse_iteration_stats([hot, STATS[0]], 1.0)
    w = summarize({"a": a, "b": b})
    assert w is not None and w.pods == 2 and w.samples == 3
    assert w.peak_utilization == pytest.approx(0.9) and w.max_blocks == 100
    assert w.paused == 1 and w.peak_queued == 2
