"""``/prometheus/metrics``: TensorRT-LLM's metric names (tensorrt_llm/metrics/collector.py) of the release kvsim
plays: 1.2's collector exports five unprefixed per-request metrics and no gauges; 1.3 prefixes them ``trtllm_`` and
adds the iteration gauges and phase histograms (PR #11243, #12545).

Per-request histograms and counters are observed when a request finishes. Iteration gauges are read from the
engine's latest iteration at scrape time; unlike the real server they do not consume the ``/metrics`` queue, so
an operator polling ``/metrics`` and Prometheus scraping this endpoint do not steal samples from each other.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..engine import Engine
from ..request import RequestRecord

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                0.5, 0.75, 1.0, 2.5)


class IterationCollector(Collector):
    """Gauges of the latest engine iteration (the same quantities as the JSON stats)."""

    def __init__(self, engine: Engine, labels: dict[str, str]) -> None:
        self.engine, self.labels = engine, labels

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def collect(self):
        s = self.engine.last_sample
        e = self.engine
        used = s.used_blocks if s else e.pool.used
        max_blocks = e.memory.num_blocks
        cfg = e.config
        # PyExecutor never sets the batch-size / token-limit fields: on PyTorch they read 0 (stats.py)
        torch = e.graphs is not None
        static_bs = 0 if torch else cfg.max_batch_size
        runtime_bs = 0 if torch else (s.max_bs_runtime if s else cfg.max_batch_size)
        runtime_nt = 0 if torch else (s.max_nt_runtime if s else cfg.max_num_tokens)
        gauges = [
            ("trtllm_kv_cache_utilization", "KV cache blocks used / max", used / max_blocks),
            ("trtllm_kv_cache_used_blocks", "KV cache blocks in use", used),
            ("trtllm_kv_cache_free_blocks", "KV cache blocks free", max_blocks - used),
            ("trtllm_kv_cache_max_blocks", "KV cache blocks in the pool", max_blocks),
            ("trtllm_kv_cache_tokens_per_block", "tokens per KV cache block", cfg.tokens_per_block),
            ("trtllm_kv_cache_hit_rate", "reused / (reused + missed) blocks",
             (s.reused / (s.reused + s.missed)) if s and s.reused + s.missed else 0.0),
            ("trtllm_num_requests_running", "active requests (numActiveRequests)", s.num_active if s else 0),
            ("trtllm_num_requests_waiting", "queued requests (numQueuedRequests)", s.num_queued if s else 0),
            ("trtllm_num_paused_requests", "requests paused in the last iteration", s.num_paused if s else 0),
            ("trtllm_num_context_requests", "context requests in the last iteration", s.num_ctx if s else 0),
            ("trtllm_num_generation_requests", "generation requests in the last iteration", s.num_gen if s else 0),
            ("trtllm_num_scheduled_requests", "scheduled requests in the last iteration", s.num_scheduled if s else 0),
            ("trtllm_total_context_tokens", "context tokens in the last iteration", s.num_ctx_tokens if s else 0),
            ("trtllm_max_num_active_requests", "max active requests", s.max_num_active if s else cfg.max_batch_size),
            ("trtllm_max_batch_size_static", "configured max_batch_size", static_bs),
            ("trtllm_max_batch_size_runtime", "max_batch_size in force (tuner included)", runtime_bs),
            ("trtllm_max_batch_size_tuner_recommended", "dynamic batch tuner recommendation", s.max_bs_tuner if s else 0),
            ("trtllm_max_num_tokens_runtime", "max_num_tokens in force", runtime_nt),
            ("trtllm_iteration_latency_seconds", "latency of the last iteration", s.latency_ms / 1e3 if s else 0.0),
            ("trtllm_gpu_memory_usage_bytes", "GPU memory held by the engine", e.memory.used_bytes),
            ("trtllm_avg_decoded_tokens_per_iter", "decoded tokens per iteration", 1.0 if s and s.num_gen else 0.0),
            ("trtllm_prefill_batch_occupancy", "context requests / max active requests",
             s.num_ctx / s.max_num_active if s else 0.0),
        ]
        for name, doc, value in gauges:
            yield self._gauge(name, doc, value)
        for name, doc, value in [("trtllm_kv_cache_reused_blocks", "reused KV blocks", s.reused if s else 0),
                                 ("trtllm_kv_cache_missed_blocks", "missed KV blocks", s.missed if s else 0),
                                 ("trtllm_num_requests_completed", "completed requests", e.counts()["completedTotal"])]:
            c = CounterMetricFamily(name, doc, labels=list(self.labels))
            c.add_metric(list(self.labels.values()), value)
            yield c


class ServeMetrics:
    def __init__(self, engine: Engine, model_name: str, prefix: str = "trtllm_", gauges: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model_name": model_name, "engine_type": "trtllm"}
        self.later = gauges  # the 1.3 collector's additions
        names = list(self.labels)

        def hist(name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(prefix + name, doc, names, buckets=buckets, registry=self.registry)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token")
        self.tpot = hist("time_per_output_token_seconds", "Time per output token", TPOT_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency")
        self.queue = hist("request_queue_time_seconds", "Time from arrival to first schedule")
        self.success = Counter(prefix + "request_success", "Finished requests", names + ["finished_reason"],
                               registry=self.registry)
        if gauges:
            self.prefill = hist("request_prefill_time_seconds", "Time from first schedule to first token")
            self.decode = hist("request_decode_time_seconds", "Time from first token to the last")
            self.inference = hist("request_inference_time_seconds", "Time from first schedule to the last token")
            self.prompt_tokens = Counter(prefix + "prompt_tokens", "Prompt tokens processed", names,
                                         registry=self.registry)
            self.generation_tokens = Counter(prefix + "generation_tokens", "Tokens generated", names,
                                             registry=self.registry)
            self.registry.register(IterationCollector(engine, self.labels))

    def observe(self, r: RequestRecord) -> None:
        values = list(self.labels.values())
        self.ttft.labels(*values).observe(r.ttft_s or 0.0)
        self.tpot.labels(*values).observe(r.tpot_s or 0.0)
        self.e2e.labels(*values).observe(r.e2e_s or 0.0)
        start = r.start_s if r.start_s is not None else r.arrival_s
        self.queue.labels(*values).observe(start - r.arrival_s)
        self.success.labels(*values, "length").inc()
        if self.later:
            self.prefill.labels(*values).observe((r.first_token_s or start) - start)
            self.decode.labels(*values).observe((r.finish_s or 0.0) - (r.first_token_s or 0.0))
            self.inference.labels(*values).observe((r.finish_s or start) - start)
            self.prompt_tokens.labels(*values).inc(r.prompt_tokens)
            self.generation_tokens.labels(*values).inc(r.output_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
