"""Turns the samples scraped from each pod over one tuning interval into the tuner's ``KvWindow``.

Signals are per pod, because the runtime max_batch_size is a per-pod limit: the window reports the
worst pod's peak (memory safety) and the mean over pods (load).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.metrics import (
    Histogram,
    IterationSample,
    LatencySnapshot,
    window_fraction_above,
    window_quantile,
)


def summarize(
    samples_by_pod: dict[str, Sequence[IterationSample]],
    latency_by_pod: dict[str, Sequence[LatencySnapshot]] | None = None,
    window_seconds: float = 0.0,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> KvWindow | None:
    pods = {p: list(v) for p, v in samples_by_pod.items() if any(s.max_blocks > 0 for s in v)}
    samples = [s for pod in pods.values() for s in pod if s.max_blocks > 0]
    if not samples:
        return None
    peak = max(samples, key=lambda s: s.kv_utilization)
    n, span = len(samples), max(window_seconds, 1e-9)
    # Two snapshots with histograms make latency data; an empty snapshot (a 1.2 page without them, or no page)
    # does not, so it can neither hide the iteration stats nor read as "no latency problem".
    latency = {p: snaps for p, snaps in (latency_by_pod or {}).items()
               if len(snaps) >= 2 and snaps[0].has_latency and snaps[-1].has_latency}
    counted = {p: snaps for p, snaps in (latency_by_pod or {}).items()
               if len(snaps) >= 2 and snaps[0].completed is not None and snaps[-1].completed is not None}
    ttft_pairs = [(snaps[0].ttft, snaps[-1].ttft) for snaps in latency.values()]
    tpot_pairs = [(snaps[0].tpot, snaps[-1].tpot) for snaps in latency.values()]
    intercept, slope = _step_fit(samples)
    return KvWindow(
        samples=n,
        pods=len(pods),
        peak_utilization=peak.kv_utilization,
        mean_utilization=sum(s.kv_utilization for s in samples) / n,
        peak_used_blocks=peak.used_blocks,
        max_blocks=peak.max_blocks,
        tokens_per_block=peak.tokens_per_block,
        peak_active=max(s.active_requests for s in samples),
        mean_active=sum(s.active_requests for s in samples) / n,
        peak_queued=max(s.queued_requests for s in samples),
        mean_queued=sum(s.queued_requests for s in samples) / n,
        paused=max(s.paused_requests for s in samples),
        runtime_batch_size=max(s.max_batch_size_runtime for s in samples),
        tuner_recommended=max(s.tuner_recommended for s in samples),
        ttft_p95_ms=_worst(ttft_pairs, lambda b, a: window_quantile(b, a, 0.95), 1000),
        tpot_p95_ms=_worst(tpot_pairs, lambda b, a: window_quantile(b, a, 0.95), 1000),
        window_seconds=window_seconds,
        completion_rate=_completion_rate(pods, counted, span),
        queue_growth=sum(v[-1].queued_requests - v[0].queued_requests for v in pods.values()) / span / len(pods),
        ttft_miss_fraction=_miss(ttft_pairs, slo_ttft_ms),
        tpot_miss_fraction=_miss(tpot_pairs, slo_tpot_ms),
        step_ms_intercept=intercept,
        step_ms_per_request=slope,
        mean_generation=sum(s.generation_requests for s in samples) / n,
        blocks_per_request=max((s.used_blocks / s.active_requests for s in samples if s.active_requests), default=0.0),
        mean_unscheduled=sum(max(0, s.active_requests - s.scheduled_requests) for s in samples
                             if s.scheduled_requests is not None) / n,
    )


MIN_FIT_SPREAD = 3  # requests of generation-batch spread needed before a slope means anything


def _step_fit(samples: list[IterationSample]) -> tuple[float | None, float | None]:
    """Least-squares line of iteration latency (ms) over the generation batch size."""
    points = [(s.generation_requests, s.iter_latency_ms) for s in samples if s.iter_latency_ms > 0]
    if len(points) < 3:
        return None, None
    xs = [x for x, _ in points]
    if max(xs) - min(xs) < MIN_FIT_SPREAD:
        return None, None
    n = len(points)
    mx, my = sum(xs) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    if slope <= 0:
        return None, None
    return my - slope * mx, slope


def _completion_rate(pods: dict[str, list[IterationSample]], counted: dict[str, Sequence[LatencySnapshot]],
                     span: float) -> float:
    """Requests finished per second per pod: per pod, from the request counter where the pod exports it (exact),
    else from its iteration stats (which undercount when the engine's stats queue overflowed between two reads).
    A pod without the counter (1.2's TensorRT backend serves no Prometheus page) never reads as 0."""
    total = 0.0
    for pod, samples in pods.items():
        snaps = counted.get(pod)
        if snaps is not None:
            total += max(0.0, (snaps[-1].completed or 0.0) - (snaps[0].completed or 0.0))
        else:
            total += sum(s.completed_requests for s in samples)
    return total / span / len(pods)


def _worst(pairs: list[tuple[Histogram, Histogram]], fn, scale: float) -> float | None:  # type: ignore[no-untyped-def]
    """Worst pod's value over the window (an objective broken on one pod is broken for its users)."""
    values = [v for before, after in pairs if (v := fn(before, after)) is not None]
    return max(values) * scale if values else None


def _miss(pairs: list[tuple[Histogram, Histogram]], slo_ms: float | None) -> float | None:
    if slo_ms is None:
        return None
    return _worst(pairs, lambda b, a: window_fraction_above(b, a, slo_ms / 1000), 1.0)
