"""Turns the samples scraped from each pod over one tuning interval into the tuner's ``KvWindow``.

Signals are per pod, because the runtime max_batch_size is a per-pod limit: the window reports the
worst pod's peak (memory safety) and the mean over pods (load).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpilot.desired.observed import KvWindow
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, window_quantile


def summarize(
    samples_by_pod: dict[str, Sequence[IterationSample]],
    latency_by_pod: dict[str, Sequence[LatencySnapshot]] | None = None,
    window_seconds: float = 0.0,
) -> KvWindow | None:
    samples = [s for pod in samples_by_pod.values() for s in pod if s.max_blocks > 0]
    if not samples:
        return None
    peak = max(samples, key=lambda s: s.kv_utilization)
    n = len(samples)
    ttft = tpot = None
    if latency_by_pod:
        ttft = _p95_ms([(snaps[0].ttft, snaps[-1].ttft) for snaps in latency_by_pod.values() if len(snaps) >= 2])
        tpot = _p95_ms([(snaps[0].tpot, snaps[-1].tpot) for snaps in latency_by_pod.values() if len(snaps) >= 2])
    return KvWindow(
        samples=n,
        pods=sum(1 for pod in samples_by_pod.values() if pod),
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
        ttft_p95_ms=ttft,
        tpot_p95_ms=tpot,
        window_seconds=window_seconds,
    )


def _p95_ms(pairs: list[tuple]) -> float | None:  # type: ignore[type-arg]
    """Worst pod's p95 over the window (an SLO broken on one pod is broken for its users)."""
    values = [q for before, after in pairs if (q := window_quantile(before, after, 0.95)) is not None]
    return max(values) * 1000 if values else None
