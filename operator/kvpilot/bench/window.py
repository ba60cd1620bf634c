"""What the operator's sampler would see of a simulated fleet over one tuning interval (the bench's window).

Each warm pod's drained iteration stats (the JSON ``GET /metrics`` returns) are parsed by the operator's own
``kvpilot.trtllm.metrics`` and summarized by ``kvpilot.autotune.summarize``; the latency the pods'
``/prometheus/metrics`` histograms would show comes from the requests that finished in the interval.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvpilot.autotune.calibrate import PromptWork
from kvpilot.autotune.summarize import MIN_TRAFFIC_REQUESTS
from kvpilot.autotune.summarize import summarize as summarize_window
from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.metrics import IterationSample, parse_iteration_stats
from kvsim import RequestRecord

if TYPE_CHECKING:
    from kvpilot.autotune.fleet import Fleet


@dataclass(frozen=True)
class Slo:
    """The objectives a benchmark scores against (milliseconds)."""

    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class PodReadings:
    """What the window was made of, per warm pod, for the tuner's engine fit (the live sampler's ``fresh``):
    the parsed iteration stats, and the prompts of the requests finished (what the 1.3 counters grow by)."""

    samples: dict[str, list[IterationSample]]
    prompts: dict[str, PromptWork]


def fleet_window(fleet: Fleet, now_s: float, interval_s: float, warmup_s: float, ready_at: dict[str, float],
                 slo: Slo, fleet_arrivals: int = 0, gave_up: int = 0,
                 arrival_counts: list[float | None] | None = None,
                 readings: PodReadings | None = None) -> KvWindow | None:
    """What the operator's sampler would see: each warm pod's drained /metrics, and the latency its
    /prometheus/metrics histograms would show (here from the requests that finished in the window).
    ``gave_up``: requests that left unanswered in the interval (shed by the gateway, or their client timed
    out); they count as TTFT misses, as a gateway's rejected/timed-out request counter would show them.
    ``arrival_counts``: the fleet's arrivals per sample period over the sampler's burstiness history."""
    pods = drain(fleet, now_s, warmup_s, ready_at, readings)
    return window_of(pods, interval_s, slo, fleet_arrivals, gave_up, arrival_counts)


@dataclass(frozen=True)
class Drained:
    """One warm pod's interval: its parsed iteration stats and the requests it finished."""

    samples: list[IterationSample]
    finished: list[RequestRecord]
    finished_total: int = 0  # the pod's request counter: requests finished since it started


def drain(fleet: Fleet, now_s: float, warmup_s: float, ready_at: dict[str, float],
          readings: PodReadings | None = None) -> dict[str, Drained]:
    """Every serving pod's drained /metrics and finished requests of the interval, by pod (pods still warming up
    are drained but left out, as the operator skips them)."""
    out: dict[str, Drained] = {}
    for r in fleet.replicas:
        if r.state != "up":
            continue
        stats = r.engine.drain_iteration_stats()
        finished = r.engine.pop_finished()
        if now_s - ready_at.get(r.name, 0.0) < warmup_s:
            continue  # the operator skips pods still warming up
        out[r.name] = Drained(parse_iteration_stats(stats, now_s), finished, r.engine.counts()["completedTotal"])
        if readings is not None:
            readings.samples[r.name] = out[r.name].samples
            readings.prompts[r.name] = PromptWork(float(sum(x.prompt_tokens for x in finished)), float(len(finished)))
    return out


def window_of(pods: dict[str, Drained], interval_s: float, slo: Slo, arrivals_n: int = 0, gave_up: int = 0,
              arrival_counts: list[float | None] | None = None) -> KvWindow | None:
    """The window of ``pods`` (a fleet, or a group of it: a canary pod, the pods beside it), ``arrivals_n``
    requests sent to them in the interval and ``gave_up`` of them left unanswered."""
    samples = {name: p.samples for name, p in pods.items()}
    finished = [x for p in pods.values() for x in p.finished]
    ttfts = [x.ttft_s * 1e3 for x in finished if x.ttft_s is not None]
    tpots = [x.tpot_s * 1e3 for x in finished if x.tpot_s is not None]
    completed = len(finished)
    good = sum(1 for x in finished if x.ttft_s is not None and x.ttft_s * 1e3 <= slo.ttft_ms
               and (x.tpot_s is None or x.tpot_s * 1e3 <= slo.tpot_ms))
    window = summarize_window(samples, window_seconds=interval_s, arrival_counts=arrival_counts)
    if window is None:
        return None
    rate = completed / interval_s / max(1, len(samples))  # what the request counter's delta would say
    arrivals = arrivals_n / interval_s / max(1, len(samples))
    # What verification compares (autotune/verify.py): the requests resolved in the interval (answered, or left
    # unanswered: shed, given up) and those that met both objectives, as a gateway's counters would show them.
    per_pod_s = interval_s * max(1, len(samples))
    window = replace(window, resolved_rate=(completed + gave_up) / per_pod_s, good_rate=good / per_pod_s)
    in_pods = sum(p.samples[-1].active_requests + p.samples[-1].queued_requests for p in pods.values() if p.samples)
    window = replace(window, finished_total=float(sum(p.finished_total for p in pods.values())), in_pods=float(in_pods))
    return replace(window, ttft_p95_ms=_p95(ttfts), tpot_p95_ms=_p95(tpots), completion_rate=rate,
                   arrival_rate=arrivals, prompt_mean=_mean([x.prompt_tokens for x in finished]),
                   output_mean=_mean([x.output_tokens for x in finished]),
                   length_share=_length_share(finished),
                   ttft_miss_fraction=_miss_share(ttfts, slo.ttft_ms, gave_up),
                   tpot_miss_fraction=_share_over(tpots, slo.tpot_ms))


def per_period(arrivals: list[float], start: float, end: float, period: float) -> list[float | None]:
    """Arrivals (sorted times) in each ``period`` of [start, end): the sampler's counts for the interval."""
    edges = [start + k * period for k in range(int(round((end - start) / period)) + 1)]
    at = [bisect.bisect_left(arrivals, e) for e in edges]
    return [float(b - a) for a, b in zip(at, at[1:])]


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _length_share(finished: list[RequestRecord]) -> float | None:
    """The share of the finished requests that stopped at their max_tokens: what the pods' request counter's
    ``finished_reason="length"`` series says (kvsim cuts an output at its request's max_tokens); the cap itself
    is not exported, so the tuner sees only this, as on live pods."""
    if len(finished) < MIN_TRAFFIC_REQUESTS:
        return None
    return sum(1 for x in finished if x.max_tokens and x.output_tokens >= x.max_tokens) / len(finished)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(0.95 * len(values)))]


def _miss_share(ttfts: list[float], limit: float, gave_up: int) -> float | None:
    """Share of the interval's requests that missed the TTFT objective, counting those that got no answer."""
    total = len(ttfts) + gave_up
    return (sum(1 for v in ttfts if v > limit) + gave_up) / total if total else None


def _share_over(values: list[float], limit: float) -> float | None:
    return sum(1 for v in values if v > limit) / len(values) if values else None
