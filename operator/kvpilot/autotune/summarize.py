"""Turns the samples scraped from each pod over one tuning interval into the tuner's ``KvWindow``.

Signals are per pod, because the runtime max_batch_size is a per-pod limit: the window reports the
worst pod's peak (memory safety) and the mean over pods (load).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.burst import arrival_cv
from kvpilot.trtllm.metrics import (
    Histogram,
    IterationSample,
    LatencySnapshot,
    window_fraction_above,
    window_quantile,
)


def summarize(
    samples_by_pod: Mapping[str, Sequence[IterationSample]],
    latency_by_pod: Mapping[str, Sequence[LatencySnapshot]] | None = None,
    window_seconds: float = 0.0,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    arrival_counts: Sequence[float | None] | None = None,
) -> KvWindow | None:
    """``arrival_counts``: the fleet's arrivals per sample period, in time order (None where a sample could not
    count them), for the burstiness estimate (autotune/burst.py); the sampler keeps a longer history of them
    than one window, since a window's six samples say little about a variance."""
    pods = {p: list(v) for p, v in samples_by_pod.items() if any(s.max_blocks > 0 for s in v)}
    samples = [s for pod in pods.values() for s in pod if s.max_blocks > 0]
    if not samples:
        return None
    span = max(window_seconds, 1e-9)
    snapshots = latency_by_pod or {}
    ttft_pairs, tpot_pairs = _latency_pairs(snapshots)
    counted = {p: snaps for p, snaps in snapshots.items()
               if len(snaps) >= 2 and snaps[0].completed is not None and snaps[-1].completed is not None}
    traffic = traffic_fit(pods, snapshots, span)
    finished_total, in_pods = _since_start(pods, counted)
    return replace(
        _iterations(samples, pods, span, window_seconds),
        ttft_p95_ms=_worst(ttft_pairs, lambda b, a: window_quantile(b, a, 0.95), 1000),
        tpot_p95_ms=_worst(tpot_pairs, lambda b, a: window_quantile(b, a, 0.95), 1000),
        completion_rate=_completion_rate(pods, counted, span),
        ttft_miss_fraction=_miss(ttft_pairs, slo_ttft_ms),
        tpot_miss_fraction=_miss(tpot_pairs, slo_tpot_ms),
        arrival_rate=traffic.arrival_rate,
        prompt_mean=traffic.prompt_mean,
        output_mean=traffic.output_mean,
        length_share=traffic.length_share,
        arrival_cv=arrival_cv(arrival_counts) if arrival_counts else None,
        finished_total=finished_total,
        in_pods=in_pods,
    )


def _since_start(pods: Mapping[str, Sequence[IterationSample]],
                 counted: Mapping[str, Sequence[LatencySnapshot]]) -> tuple[float, float]:
    """The requests the pods finished since they started (their request counters) and the requests in them at
    the window's end (autotune/censored.py), where every pod exports the counter; nothing otherwise (a pod
    without it would read as one that has finished nothing): (0, 0) then."""
    if not pods or set(pods) - set(counted):
        return 0.0, 0.0
    finished = sum(counted[p][-1].completed or 0.0 for p in pods)
    in_pods = sum(v[-1].active_requests + v[-1].queued_requests for v in pods.values() if v)
    if not (math.isfinite(finished) and finished >= 0 and in_pods >= 0):
        return 0.0, 0.0
    return finished, float(in_pods)


def _latency_pairs(snapshots: Mapping[str, Sequence[LatencySnapshot]]) -> tuple[
        list[tuple[Histogram, Histogram]], list[tuple[Histogram, Histogram]]]:
    """(first, last) TTFT and TPOT histograms of each pod with latency data. Two snapshots with histograms make
    latency data; an empty snapshot (a 1.2 page without them, or no page) does not, so it can neither hide the
    iteration stats nor read as "no latency problem"."""
    latency = [snaps for snaps in snapshots.values()
               if len(snaps) >= 2 and snaps[0].has_latency and snaps[-1].has_latency]
    return [(snaps[0].ttft, snaps[-1].ttft) for snaps in latency], [(snaps[0].tpot, snaps[-1].tpot) for snaps in latency]


def _iterations(samples: list[IterationSample], pods: dict[str, list[IterationSample]], span: float,
                window_seconds: float) -> KvWindow:
    """The window as the iteration stats alone describe it (the pool, the batch, the queue, the step latency)."""
    peak = max(samples, key=lambda s: s.kv_utilization)
    n = len(samples)
    intercept, slope = _step_fit(samples)
    limit = agreed_active_limit(samples)
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
        window_seconds=window_seconds,
        queue_growth=sum(v[-1].queued_requests - v[0].queued_requests for v in pods.values()) / span / len(pods),
        step_ms_intercept=intercept,
        step_ms_per_request=slope,
        mean_generation=sum(s.generation_requests for s in samples) / n,
        blocks_per_request=max((s.used_blocks / s.active_requests for s in samples if s.active_requests), default=0.0),
        mean_unscheduled=sum(max(0, s.active_requests - s.scheduled_requests) for s in samples
                             if s.scheduled_requests is not None) / n,
        active_limit=limit,
        full_waiting_share=sum(1 for s in samples if limit and s.queued_requests > 0 and s.active_requests >= limit) / n,
    )


def agreed_active_limit(samples: Sequence[IterationSample]) -> int:
    """The cap on active requests the samples report (maxNumActiveRequests), when all that report one agree; 0
    when none does (an older payload, Prometheus) or they disagree (pods on different limits, or one that is not
    what it claims), so no single cap is in force to call a batch full against."""
    reported = {s.max_num_active_requests for s in samples if s.max_num_active_requests > 0}
    return reported.pop() if len(reported) == 1 else 0


MIN_TRAFFIC_REQUESTS = 5  # fewer finished requests in a window say nothing about the traffic's lengths
# Beyond any real engine (a 1M-token context, 10,000 requests/s on one pod): a hostile or broken pod, not traffic.
MAX_MEAN_TOKENS = 2**20
MAX_RATE_PER_POD = 10_000.0


@dataclass(frozen=True)
class Traffic:
    """Requests received per second per pod, the mean prompt and output of the window (0: unknown), and the share
    of the finished requests that stopped at their max_tokens (None: unknown)."""

    arrival_rate: float = 0.0
    prompt_mean: float = 0.0
    output_mean: float = 0.0
    length_share: float | None = None


def traffic_fit(pods: Mapping[str, Sequence[IterationSample]], latency_by_pod: Mapping[str, Sequence[LatencySnapshot]],
                span: float) -> Traffic:
    """The traffic the pods saw, for the tuner's what-if (autotune/replay.py fit_traffic), from what every
    release exposes, the exact counters first:

    * finished requests: ``request_success_total`` where the pod serves /prometheus/metrics, else the
      iteration stats' ``numCompletedRequests``;
    * arrivals = finished + growth of the requests in the pod (active + queued) over the window: a queue that
      grows is traffic too (a rate from completions alone would cap at the capacity it should judge);
    * mean prompt: ``trtllm_prompt_tokens_total`` per finished request (1.3), else the context tokens the
      iterations computed (``numCtxTokens``) plus those found in the KV reuse cache (``reusedBlocks`` growth
      times ``tokensPerBlock``) per request admitted (finished + growth of the active ones);
    * mean output: ``trtllm_generation_tokens_total`` per finished request (1.3), else the generation steps
      (``numGenRequests`` per iteration, times the iterations a sample stands for by its ``iter``: one token
      per request per step) per finished request, plus the first token, which the context step makes.

    Over the fleet the means are weighted by requests. A window with fewer than MIN_TRAFFIC_REQUESTS finished
    requests, or a figure that is not finite and positive, is unknown (0), and the tuner's what-if holds off.
    The iteration-stats estimates assume the stats queue was not overflowed between two scrapes (at most
    iter_stats_max_iterations iterations per scrape interval); a loss shrinks numerator and denominator alike.
    * share stopped at max_tokens: the ``finished_reason="length"`` series of ``request_success_total`` per
      finished request, over the pods that export the counter (no release exports max_tokens itself).
    """
    arrived = finished = prompt_tokens = admitted = output_tokens = outputs = cut = cut_of = 0.0
    for pod, samples in pods.items():
        if not samples:
            continue
        one = _pod_traffic(samples, [s for s in latency_by_pod.get(pod, ()) if s.completed is not None])
        arrived += one.arrived
        finished += one.finished
        prompt_tokens += one.prompt_tokens
        admitted += one.admitted
        output_tokens += one.output_tokens
        outputs += one.outputs
        if one.cut is not None:
            cut, cut_of = cut + one.cut, cut_of + one.finished
    if finished < MIN_TRAFFIC_REQUESTS or not pods or span <= 0:
        return Traffic()

    def ratio(num: float, den: float) -> float:
        value = num / den if den >= MIN_TRAFFIC_REQUESTS else 0.0
        return value if math.isfinite(value) and 0 < value <= MAX_MEAN_TOKENS else 0.0

    rate = arrived / span / len(pods)
    return Traffic(arrival_rate=rate if math.isfinite(rate) and rate <= MAX_RATE_PER_POD else 0.0,
                   prompt_mean=ratio(prompt_tokens, admitted), output_mean=ratio(output_tokens, outputs),
                   length_share=min(1.0, cut / cut_of) if cut_of >= MIN_TRAFFIC_REQUESTS else None)


@dataclass(frozen=True)
class _PodTraffic:
    """One pod's share of the window's traffic: requests and the tokens to divide by them (see traffic_fit)."""

    arrived: float
    finished: float
    prompt_tokens: float
    admitted: float  # the requests ``prompt_tokens`` were computed for
    output_tokens: float
    outputs: float  # the requests ``output_tokens`` were made for
    cut: float | None = None  # of ``finished``, those stopped at their max_tokens; None: not counted


def _pod_traffic(samples: Sequence[IterationSample], snaps: list[LatencySnapshot]) -> _PodTraffic:
    """``snaps``: the pod's latency snapshots that carry the request counter."""
    first, last = samples[0], samples[-1]
    counted = len(snaps) >= 2
    done = max(0.0, (snaps[-1].completed or 0.0) - (snaps[0].completed or 0.0)) if counted \
        else float(sum(s.completed_requests for s in samples))
    in_pod = (last.active_requests + last.queued_requests) - (first.active_requests + first.queued_requests)
    if counted and snaps[0].prompt_tokens is not None and snaps[-1].prompt_tokens is not None:
        prompt_tokens, admitted = max(0.0, snaps[-1].prompt_tokens - snaps[0].prompt_tokens), done
    else:
        reused = max(0, last.reused_blocks - first.reused_blocks) * last.tokens_per_block
        prompt_tokens = sum(s.ctx_tokens for s in samples) + reused
        admitted = max(0.0, sum(s.completed_requests for s in samples) + last.active_requests - first.active_requests)
    if counted and snaps[0].generation_tokens is not None and snaps[-1].generation_tokens is not None:
        output_tokens, outputs = max(0.0, snaps[-1].generation_tokens - snaps[0].generation_tokens), done
    else:
        steps = sum(s.completed_requests for s in samples)
        output_tokens, outputs = _generation_steps(samples) + steps, steps
    return _PodTraffic(max(0.0, done + in_pod), done, prompt_tokens, admitted, output_tokens, outputs,
                       _cut(snaps, done) if counted else None)


def _cut(snaps: list[LatencySnapshot], done: float) -> float | None:
    """Requests the pod finished at their max_tokens over the window, at most the ``done`` it finished; None when
    it does not say, or either counter went back (a restarted pod: its requests are not counted, so nor are its
    cut ones)."""
    before, after = snaps[0].length_finished, snaps[-1].length_finished
    if before is None or after is None or after < before or (snaps[-1].completed or 0.0) < (snaps[0].completed or 0.0):
        return None
    return min(after - before, done)


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


def _worst(pairs: list[tuple[Histogram, Histogram]], fn: Callable[[Histogram, Histogram], float | None],
           scale: float) -> float | None:
    """Worst pod's value over the window (an objective broken on one pod is broken for its users)."""
    values = [v for before, after in pairs if (v := fn(before, after)) is not None]
    return max(values) * scale if values else None


def _miss(pairs: list[tuple[Histogram, Histogram]], slo_ms: float | None) -> float | None:
    if slo_ms is None:
        return None
    return _worst(pairs, lambda b, a: window_fraction_above(b, a, slo_ms / 1000), 1.0)


MAX_ITERATIONS_PER_SAMPLE = 100_000  # a larger step of ``iter`` is a restarted counter, not a run


def _generation_steps(samples: Sequence[IterationSample]) -> float:
    """Tokens the generation phase made over the samples: each generating request makes one per iteration,
    and a sample stands for the iterations since the previous one (``iter`` steps; 1 when not reported)."""
    total, prev = 0.0, None
    for s in samples:
        step = s.iteration - prev if prev is not None and s.iteration > prev else 1
        total += s.generation_requests * (step if step <= MAX_ITERATIONS_PER_SAMPLE else 1)
        prev = s.iteration
    return total
