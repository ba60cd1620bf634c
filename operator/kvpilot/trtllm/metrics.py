"""Parses what trtllm-serve reports: ``/metrics`` iteration stats (JSON) and ``/prometheus/metrics`` (text).

Field and metric names are TensorRT-LLM's (tensorrt_llm/serve/openai_server.py, metrics/collector.py; see
shared reference trtllm.md §4). KV utilization is computed as usedNumBlocks / maxNumBlocks, as NVIDIA's
collector does, rather than trusting a precomputed fraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class IterationSample:
    """One iteration's stats from one pod (or one Prometheus scrape, which has no iteration detail)."""

    timestamp_s: float
    used_blocks: int
    max_blocks: int
    tokens_per_block: int
    active_requests: int
    queued_requests: int
    paused_requests: int
    max_batch_size_runtime: int
    max_batch_size_static: int
    tuner_recommended: int = 0
    iter_latency_ms: float = 0.0
    context_requests: int = 0
    generation_requests: int = 0
    completed_requests: int = 0  # finished in this iteration (a run of iterations when aggregated)
    # Requests the capacity scheduler let run this iteration. Active requests it did not schedule are
    # waiting for KV blocks (under GUARANTEED_NO_EVICT, for their reservation): the limit is not what binds.
    scheduled_requests: int | None = None

    @property
    def kv_utilization(self) -> float:
        return self.used_blocks / self.max_blocks if self.max_blocks else 0.0


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts of a Prometheus histogram (upper bound -> count)."""

    buckets: tuple[tuple[float, float], ...] = ()
    count: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class LatencySnapshot:
    """Cumulative TTFT / TPOT histograms of one pod at one scrape; deltas of two give a window."""

    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    completed: float = 0.0  # trtllm_request_success_total, all finish reasons


def _int(d: dict[str, Any], key: str) -> int:
    value = d.get(key, 0)
    return int(value) if isinstance(value, (int, float)) else 0


def parse_iteration_stats(payload: Any, now_s: float) -> list[IterationSample]:
    """``/metrics`` returns a JSON list of per-iteration objects (drained on read; ``[]`` when idle)."""
    if not isinstance(payload, list):
        raise ValueError("trtllm-serve /metrics must return a JSON list of iteration stats")
    samples = []
    for item in payload:
        if not isinstance(item, dict):
            continue
        kv = item.get("kvCacheStats") or {}
        ifb = item.get("inflightBatchingStats") or {}
        samples.append(
            IterationSample(
                # Stamped with the scrape time: TensorRT-LLM's own "timestamp" is a local-time string.
                timestamp_s=now_s,
                used_blocks=_int(kv, "usedNumBlocks"),
                max_blocks=_int(kv, "maxNumBlocks"),
                tokens_per_block=_int(kv, "tokensPerBlock"),
                active_requests=_int(item, "numActiveRequests"),
                queued_requests=_int(item, "numQueuedRequests"),
                paused_requests=_int(ifb, "numPausedRequests"),
                max_batch_size_runtime=_int(item, "maxBatchSizeRuntime"),
                max_batch_size_static=_int(item, "maxBatchSizeStatic"),
                tuner_recommended=_int(item, "maxBatchSizeTunerRecommended"),
                iter_latency_ms=float(item.get("iterLatencyMS") or 0.0),
                context_requests=_int(ifb, "numContextRequests"),
                generation_requests=_int(ifb, "numGenRequests"),
                completed_requests=_int(item, "numCompletedRequests"),
                scheduled_requests=_int(ifb, "numScheduledRequests") if "numScheduledRequests" in ifb else None,
            )
        )
    return samples


def parse_prometheus(text: str, now_s: float) -> tuple[IterationSample | None, LatencySnapshot]:
    """``/prometheus/metrics``: the iteration gauges (trtllm_*) and the latency histograms."""
    gauges: dict[str, float] = {}
    hist: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket"):
                h = hist.setdefault(s.name[: -len("_bucket")], {"buckets": []})
                h["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count") and family.type == "histogram":
                hist.setdefault(s.name[: -len("_count")], {"buckets": []})["count"] = s.value
            elif s.name.endswith("_sum") and family.type == "histogram":
                hist.setdefault(s.name[: -len("_sum")], {"buckets": []})["total"] = s.value
            else:
                gauges[s.name] = gauges.get(s.name, 0.0) + s.value
    latency = LatencySnapshot(
        ttft=_histogram(hist.get("trtllm_time_to_first_token_seconds")),
        tpot=_histogram(hist.get("trtllm_time_per_output_token_seconds")),
        completed=gauges.get("trtllm_request_success_total", 0.0),
    )
    if "trtllm_kv_cache_max_blocks" not in gauges:
        return None, latency
    g = lambda name: int(gauges.get(name, 0))  # noqa: E731
    sample = IterationSample(
        timestamp_s=now_s,
        used_blocks=g("trtllm_kv_cache_used_blocks"),
        max_blocks=g("trtllm_kv_cache_max_blocks"),
        tokens_per_block=g("trtllm_kv_cache_tokens_per_block"),
        active_requests=g("trtllm_num_requests_running"),
        queued_requests=g("trtllm_num_requests_waiting"),
        paused_requests=g("trtllm_num_paused_requests"),
        max_batch_size_runtime=g("trtllm_max_batch_size_runtime"),
        max_batch_size_static=g("trtllm_max_batch_size_static"),
    )
    return sample, latency


def _histogram(raw: dict[str, Any] | None) -> Histogram:
    if not raw:
        return Histogram()
    buckets = tuple(sorted((le, v) for le, v in raw["buckets"]))
    return Histogram(buckets=buckets, count=raw.get("count", 0.0), total=raw.get("total", 0.0))


def window_quantile(before: Histogram, after: Histogram, q: float) -> float | None:
    """The q-quantile (seconds) of observations between two cumulative scrapes, by bucket interpolation."""
    prev = dict(before.buckets)
    deltas = [(le, v - prev.get(le, 0.0)) for le, v in after.buckets]
    total = after.count - before.count
    if total <= 0 or not deltas:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, cumulative in deltas:
        if cumulative >= rank:
            if le == float("inf"):
                return lower_bound
            span = cumulative - lower_count
            frac = (rank - lower_count) / span if span > 0 else 1.0
            return lower_bound + (le - lower_bound) * frac
        lower_bound, lower_count = le, cumulative
    return lower_bound


def window_fraction_above(before: Histogram, after: Histogram, threshold_s: float) -> float | None:
    """Share of the observations between two scrapes that exceeded ``threshold_s`` (bucket interpolation)."""
    prev = dict(before.buckets)
    total = after.count - before.count
    if total <= 0 or not after.buckets:
        return None
    lower_bound, lower_count = 0.0, 0.0
    for le, cumulative in after.buckets:
        count = cumulative - prev.get(le, 0.0)
        if le >= threshold_s:
            if le == float("inf"):
                below = lower_count
            else:
                frac = (threshold_s - lower_bound) / (le - lower_bound) if le > lower_bound else 1.0
                below = lower_count + (count - lower_count) * frac
            return max(0.0, min(1.0, 1.0 - below / total))
        lower_bound, lower_count = le, count
    return 0.0
