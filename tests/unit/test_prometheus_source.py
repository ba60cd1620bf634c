"""``source: Prometheus``: a range query's raw samples become the same window the Pod source computes from
the same exposition text (observe/prometheus.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvpilot.observe.prometheus import samples_from_matrix, window_query
from kvpilot.autotune.summarize import summarize
from kvpilot.trtllm.metrics import parse_prometheus


def scrape(used: int, waiting: int, ttft_fast: int, ttft_slow: int, done: int) -> str:
    return f"""# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{{model_name="m"}} 1000
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{{model_name="m"}} {used}
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{{model_name="m"}} 32
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{{model_name="m"}} 8
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{{model_name="m"}} {waiting}
# TYPE trtllm_max_batch_size_runtime gauge
trtllm_max_batch_size_runtime{{model_name="m"}} 8
# TYPE trtllm_request_success counter
trtllm_request_success_total{{model_name="m",finished_reason="length"}} {done}
trtllm_request_success_total{{model_name="m",finished_reason="stop"}} 1
# TYPE trtllm_time_to_first_token_seconds histogram
trtllm_time_to_first_token_seconds_bucket{{model_name="m",le="0.5"}} {ttft_fast}
trtllm_time_to_first_token_seconds_bucket{{model_name="m",le="1.0"}} {ttft_fast}
trtllm_time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {ttft_fast + ttft_slow}
trtllm_time_to_first_token_seconds_count{{model_name="m"}} {ttft_fast + ttft_slow}
trtllm_time_to_first_token_seconds_sum{{model_name="m"}} 9.5
"""


def as_matrix(pod: str, scrapes: list[tuple[float, str]]) -> list[dict]:
    """What Prometheus answers to a range selector after scraping these texts (with the PodMonitor's labels)."""
    series: dict[tuple, dict] = {}
    for stamp, text in scrapes:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                metric = {"__name__": s.name, **s.labels, "namespace": "ns", "engine": "e", "pod": pod,
                          "job": "ns/kvpilot-engines", "endpoint": "http", "container": "server"}
                key = tuple(sorted(metric.items()))
                value = "+Inf" if s.value == float("inf") else str(s.value)
                series.setdefault(key, {"metric": metric, "values": []})["values"].append([stamp, value])
    return list(series.values())


def test_the_window_from_prometheus_equals_the_window_from_the_same_scrapes() -> None:
    texts = [(100.0, scrape(100, 0, 10, 0, 5)), (102.0, scrape(400, 3, 12, 8, 15)), (104.0, scrape(300, 5, 12, 18, 25))]
    matrix = as_matrix("e-1", texts) + as_matrix("e-2", texts[:2])
    samples, latency = samples_from_matrix(matrix)
    direct = {pod: [parse_prometheus(t, stamp) for stamp, t in (texts if pod == "e-1" else texts[:2])]
              for pod in ("e-1", "e-2")}
    assert samples == {pod: [s for s, _ in v] for pod, v in direct.items()}
    assert latency == {pod: [snap for _, snap in v] for pod, v in direct.items()}
    window = summarize(samples, latency, window_seconds=30, slo_ttft_ms=1000)
    assert window is not None and window.pods == 2 and window.samples == 5
    assert window.peak_used_blocks == 400 and window.peak_queued == 5
    # e-1: 18 of 20 new requests slower than 1s -> 90% miss; completions (5->26 over 30s).
    assert abs(window.ttft_miss_fraction - 0.9) < 1e-9
    assert window.completion_rate > 0


def test_only_live_pods_count_and_other_series_are_ignored() -> None:
    texts = [(100.0, scrape(100, 0, 1, 0, 1)), (102.0, scrape(200, 1, 2, 0, 2))]
    old = as_matrix("e-old", [(s, t.replace(" 1000\n", " 10\n")) for s, t in texts])
    samples, _ = samples_from_matrix(as_matrix("e-new", texts) + old, live_pods={"e-new"})
    assert set(samples) == {"e-new"} and samples["e-new"][0].max_blocks == 1000
    assert samples_from_matrix([{"metric": {"__name__": "up"}, "values": [[1, "1"]]}]) == ({}, {})


def test_the_query_selects_the_engine_and_escapes_its_labels() -> None:
    assert window_query("ns", "e", 30) == '{namespace="ns",engine="e",pod!=""}[30s]'
    assert window_query('a"b', "e\\", 45) == '{namespace="a\\"b",engine="e\\\\",pod!=""}[45s]'
