"""Parses what trtllm-serve reports: ``/metrics`` iteration stats (JSON) and ``/prometheus/metrics`` (text).

Field and metric names are TensorRT-LLM's (tensorrt_llm/serve/openai_server.py, metrics/collector.py; see
shared reference trtllm.md §4); the Prometheus names differ per release and come from ``options/releases.yaml``.
Everything here is untrusted input from any pod that carries the engine's labels: typed, bounded, and a bad
payload raises ``MetricsRejected`` (a ValueError) rather than anything else. KV utilization is computed as usedNumBlocks / maxNumBlocks, as NVIDIA's
collector does, rather than trusting a precomputed fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvpilot.trtllm.surface import metric_spellings


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
    # Prompt tokens the context phase processed this iteration (inflightBatchingStats.numCtxTokens, every
    # release): summed over a window and divided by the requests admitted, the mean prompt the pods saw.
    ctx_tokens: int = 0
    # The iteration's number (``iter``): its step over the previous sample says how many iterations this sample
    # stands for (kvsim reports a run of identical decode iterations once; a server whose stats queue
    # overflowed between two scrapes dropped some), so generation steps are counted per iteration.
    iteration: int = 0
    # KV blocks found in the reuse cache so far (kvCacheStats.reusedBlocks, a cumulative counter): their prompt
    # tokens were not computed, so numCtxTokens alone would read shared prompts as short ones.
    reused_blocks: int = 0
    # The executor's cap on active requests (maxNumActiveRequests): what the PyTorch backend reports of its limit,
    # since PyExecutor never sets the maxBatchSize* fields (they read 0). It is max_batch_size x PP
    # (PyExecutor.max_num_active_requests = model_engine.get_max_num_sequences() = pp_size * batch_size), and the
    # executor fetches queued requests only while numActiveRequests is below it (``_fetch_new_requests``):
    # tensorrt_llm/_torch/pyexecutor/py_executor.py and model_engine.py, index ids 4553249729, 3542389387,
    # 54965565749, 707893322 (no release tag confirmed). 0: not reported.
    max_num_active_requests: int = 0

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
    # The finished-requests counter (request_success_total, all finish reasons); None when the pod does not
    # export it, so the completion rate falls back to the iteration stats instead of reading 0.
    completed: float | None = None
    # Of those, the ones that stopped at their max_tokens (the counter's ``finished_reason="length"`` series: the
    # reason tensorrt_llm/executor/result.py sets for FinishReason.LENGTH; collector.py labels the counter with
    # it). No release exports max_tokens itself; the share cut there tells the tuner where the cap is
    # (autotune/capped.py cap_from_length_share). None when the counter is absent or carries no finish reason;
    # 0 when no request hit its cap.
    length_finished: float | None = None
    # Prompt and generated tokens of finished requests (counters of the 1.3 collector: trtllm_prompt_tokens_total,
    # trtllm_generation_tokens_total); None when the release does not export them (1.2): the iteration stats
    # then give the traffic's lengths (autotune/summarize.py).
    prompt_tokens: float | None = None
    generation_tokens: float | None = None

    @property
    def has_latency(self) -> bool:
        """An empty snapshot (no histogram exported) is not latency data."""
        return bool(self.ttft.buckets or self.tpot.buckets)


class MetricsRejected(ValueError):
    """A metrics payload that is not what trtllm-serve sends: a rejected sample, never a crash."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a short label for the operator's own counter (bounded cardinality)


# Bounds of a sane reply. trtllm-serve keeps at most iter_stats_max_iterations (default 1000) iterations.
MAX_ITERATIONS = 20_000
MAX_COUNT = 2**40  # blocks, requests, batch sizes: far above any real engine, far below float trouble
MAX_LATENCY_MS = 1e7
MAX_PROMETHEUS_SAMPLES = 50_000


def _count(d: dict[str, Any], key: str, where: str) -> int:
    """A non-negative integer field (absent: 0). Booleans, strings, lists, NaN, Inf and fractions are rejected."""
    value = d.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MetricsRejected("type", f"{where}.{key} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise MetricsRejected("value", f"{where}.{key} must be a whole finite number, got {value!r}")
    if not 0 <= value <= MAX_COUNT:
        raise MetricsRejected("range", f"{where}.{key} must be between 0 and {MAX_COUNT}, got {value!r}")
    return int(value)


def _section(item: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MetricsRejected("type", f"{where}.{key} must be an object, got {type(value).__name__}")
    return value


def _latency_ms(item: dict[str, Any], where: str) -> float:
    value = item.get("iterLatencyMS")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetricsRejected("type", f"{where}.iterLatencyMS must be a finite number, got {value!r:.40}")
    if not 0 <= value <= MAX_LATENCY_MS:
        raise MetricsRejected("range", f"{where}.iterLatencyMS must be between 0 and {MAX_LATENCY_MS:g}, got {value!r}")
    return float(value)


def parse_iteration_stats(payload: Any, now_s: float) -> list[IterationSample]:
    """``/metrics`` returns a JSON list of per-iteration objects (drained on read; ``[]`` when idle).

    Typed and bounded: anything else raises ``MetricsRejected`` naming the field, so one odd reply is one
    rejected sample, never an exception that stops the engine's loop (issue 13)."""
    if not isinstance(payload, list):
        raise MetricsRejected("shape", f"/metrics must return a JSON list of iteration stats, got {type(payload).__name__}")
    if len(payload) > MAX_ITERATIONS:
        raise MetricsRejected("size", f"/metrics returned {len(payload)} iterations, more than {MAX_ITERATIONS}")
    samples = []
    for i, item in enumerate(payload):
        where = f"[{i}]"
        if not isinstance(item, dict):
            raise MetricsRejected("shape", f"{where} must be an object, got {type(item).__name__}")
        kv = _section(item, "kvCacheStats", where)
        ifb = _section(item, "inflightBatchingStats", where)
        kvw, ifw = f"{where}.kvCacheStats", f"{where}.inflightBatchingStats"
        samples.append(
            IterationSample(
                # Stamped with the scrape time: TensorRT-LLM's own "timestamp" is a local-time string.
                timestamp_s=now_s,
                used_blocks=_count(kv, "usedNumBlocks", kvw),
                max_blocks=_count(kv, "maxNumBlocks", kvw),
                tokens_per_block=_count(kv, "tokensPerBlock", kvw),
                active_requests=_count(item, "numActiveRequests", where),
                queued_requests=_count(item, "numQueuedRequests", where),
                paused_requests=_count(ifb, "numPausedRequests", ifw),
                max_batch_size_runtime=_count(item, "maxBatchSizeRuntime", where),
                max_batch_size_static=_count(item, "maxBatchSizeStatic", where),
                tuner_recommended=_count(item, "maxBatchSizeTunerRecommended", where),
                iter_latency_ms=_latency_ms(item, where),
                context_requests=_count(ifb, "numContextRequests", ifw),
                generation_requests=_count(ifb, "numGenRequests", ifw),
                completed_requests=_count(item, "numCompletedRequests", where),
                scheduled_requests=_count(ifb, "numScheduledRequests", ifw) if "numScheduledRequests" in ifb else None,
                ctx_tokens=_count(ifb, "numCtxTokens", ifw),
                iteration=_count(item, "iter", where),
                reused_blocks=_count(kv, "reusedBlocks", kvw),
                max_num_active_requests=_count(item, "maxNumActiveRequests", where),
            )
        )
    return samples


LENGTH_REASON = "length"  # finished_reason of a request stopped by its max_tokens (executor/result.py)


def _families(text: str) -> tuple[dict[str, float], dict[str, dict[str, Any]], dict[str, float]]:
    """Gauges/counters (summed over labels), histograms, and, of the counters labelled by ``finished_reason``,
    the ``"length"`` series alone (0 where the label is there but no request hit its cap yet; a counter without
    the label is absent, so it reads as unknown, not as none cut), of a Prometheus text page, bounded and finite."""
    if not isinstance(text, str):
        raise MetricsRejected("shape", "/prometheus/metrics must be text")
    completed_names = set(metric_spellings().get("completed", ()))
    gauges: dict[str, float] = {}
    lengths: dict[str, float] = {}
    hist: dict[str, dict[str, Any]] = {}
    seen = 0
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                seen += 1
                if seen > MAX_PROMETHEUS_SAMPLES:
                    raise MetricsRejected("size", f"/prometheus/metrics has more than {MAX_PROMETHEUS_SAMPLES} samples")
                value = float(s.value)
                if math.isnan(value):
                    raise MetricsRejected("value", f"/prometheus/metrics sample {s.name:.80} is NaN")
                if s.name.endswith("_bucket") and family.type == "histogram":
                    le = float(s.labels.get("le", "nan"))
                    if math.isnan(le) or math.isinf(value):
                        raise MetricsRejected("value", f"/prometheus/metrics bucket {s.name:.80} is malformed")
                    hist.setdefault(s.name[: -len("_bucket")], {"buckets": []})["buckets"].append((le, value))
                elif s.name.endswith("_count") and family.type == "histogram":
                    hist.setdefault(s.name[: -len("_count")], {"buckets": []})["count"] = value
                elif s.name.endswith("_sum") and family.type == "histogram":
                    hist.setdefault(s.name[: -len("_sum")], {"buckets": []})["total"] = value
                else:
                    if math.isinf(value):
                        raise MetricsRejected("value", f"/prometheus/metrics sample {s.name:.80} is infinite")
                    if family.type == "counter" and value < 0:
                        raise MetricsRejected("value", f"/prometheus/metrics counter {s.name:.80} is negative")
                    gauges[s.name] = gauges.get(s.name, 0.0) + value
                    reason = s.labels.get("finished_reason")
                    if reason is not None and s.name in completed_names:  # however the page types the family
                        if value < 0:
                            raise MetricsRejected("value", f"/prometheus/metrics counter {s.name:.80} is negative")
                        lengths[s.name] = lengths.get(s.name, 0.0) + (value if reason == LENGTH_REASON else 0.0)
    except MetricsRejected:
        raise
    except Exception as exc:  # noqa: BLE001 — the text parser raises many types on hostile input
        raise MetricsRejected("syntax", f"/prometheus/metrics is not Prometheus text: {str(exc)[:200]}") from None
    return gauges, hist, lengths


def _first(table: dict[str, Any], logical: str) -> Any:
    """The value under the first spelling of a logical metric that the page has (1.2: unprefixed; later:
    trtllm_-prefixed), None when it has none."""
    for name in metric_spellings().get(logical, ()):
        if name in table:
            return table[name]
    return None


def parse_prometheus(text: str, now_s: float) -> tuple[IterationSample | None, LatencySnapshot]:
    """``/prometheus/metrics``: the iteration gauges and the latency histograms, under either spelling."""
    gauges, hist, lengths = _families(text)
    completed, cut = _first(gauges, "completed"), _first(lengths, "completed")
    latency = LatencySnapshot(
        ttft=_histogram(_first(hist, "ttft")),
        tpot=_histogram(_first(hist, "tpot")),
        completed=completed,
        length_finished=None if completed is None or cut is None else min(completed, cut),
        prompt_tokens=_first(gauges, "prompt_tokens"),
        generation_tokens=_first(gauges, "generation_tokens"),
    )
    if _first(gauges, "max_blocks") is None:
        return None, latency

    def g(logical: str) -> int:
        value = _first(gauges, logical) or 0.0
        return int(value) if 0 <= value <= MAX_COUNT else 0

    sample = IterationSample(
        timestamp_s=now_s,
        used_blocks=g("used_blocks"),
        max_blocks=g("max_blocks"),
        tokens_per_block=g("tokens_per_block"),
        active_requests=g("running"),
        queued_requests=g("waiting"),
        paused_requests=g("paused"),
        max_batch_size_runtime=g("runtime_batch"),
        max_batch_size_static=g("static_batch"),
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
