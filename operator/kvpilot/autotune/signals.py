"""Signal readers: what the window says about the pool, the batch, the queue and the objectives.

Each reads a ``KvWindow`` (and the objectives, or the limit in force, where it needs them) and answers one
question the rules ask; none decides anything.
"""

from __future__ import annotations

import math

from kvpilot.api.models import SloSpec
from kvpilot.autotune.constants import (
    LITTLE_MARGIN,
    MAX_RAISE_FACTOR,
    MIN_RAISE_FACTOR,
    REVERSAL_MIN_TPOT_MISSES,
    SETTLED_TRADE_OFF_P95,
    SEVERE_MISSES,
    TPOT_HEADROOM,
    TRADE_OFF_P95,
    TPOT_MISS_TOLERANCE,
    TTFT_MISS_TOLERANCE,
)
from kvpilot.autotune.window import KvWindow


def slo_broken(slo: SloSpec | None, w: KvWindow) -> str | None:
    """Why the TPOT objective is broken (p95 over it, or too many misses); None when it holds or is not set."""
    if slo is None or not slo.time_per_output_token_millis:
        return None
    over = w.tpot_miss_fraction is not None and w.tpot_miss_fraction > TPOT_MISS_TOLERANCE
    if (w.tpot_p95_ms and w.tpot_p95_ms > slo.time_per_output_token_millis) or over:
        p95 = f"{w.tpot_p95_ms:.0f}ms" if w.tpot_p95_ms else "unknown"
        return f"p95 TPOT {p95} > objective {slo.time_per_output_token_millis}ms"
    return None


def tpot_trade_off(slo: SloSpec | None, w: KvWindow, settled: tuple[float, float] | None = None) -> bool:
    """True when a TPOT break is mild (fewer than REVERSAL_MIN_TPOT_MISSES of the requests miss it, p95 within
    TRADE_OFF_P95 of the objective) and the TPOT misses are no more than the TTFT misses beside them: the engine
    is at capacity on both sides, and a lower trades TPOT misses for more TTFT misses (it admits fewer while
    requests already queue). Whether that pays is the what-if's call, not a measurement's: measured on the suite's
    overloaded case with a 22 ms TPOT objective (an engine decoding 30% off its profile), the lowers from 64 on a
    p95 that brushed the objective (11% TPOT misses beside 23% TTFT misses) served less than 64 did. A cliff (many
    TPOT misses, or a p95 far over: past TRADE_OFF_P95 on the window's shares, past SETTLED_TRADE_OFF_P95 on the
    settled minutes') is never a trade-off, whatever the TTFT misses: slow decoding queues requests.

    The shares are the window's, or ``settled`` (TPOT, TTFT misses over the settled minutes at this limit, while
    this window's batch fills it: ``rules.settled_split``) where those show the trade-off, with TTFT misses beyond
    TTFT_MISS_TOLERANCE (nothing to trade otherwise): one window's split scatters. Measured on that case
    served by PyTorch with a spare GPU: at 64 the windows' TPOT misses ran 6-19% beside 14-29% TTFT misses for
    two minutes, then one window read 28% beside 20%, and the lower it made protective served 0.92x what 64 did.
    One window's p95 scatters as its shares do, so where the settled minutes show the trade-off it is bounded
    only at SETTLED_TRADE_OFF_P95; and a window where SEVERE_MISSES or more of the requests miss TPOT (or where
    the share is unknown; live, the share is the pod that misses most: ``summarize._miss``) is a cliff whatever
    they show. Measured on the same case with prefill 30% off its profile: the settled minutes split 10% beside
    17-18%, a window read p95 over 1.1x the objective by less than 0.05 ms with 14% missing, and the lower it made
    protective served 0.95x what 64 did."""
    objective = slo.time_per_output_token_millis if slo is not None else None
    if not objective:
        return False
    if (w.tpot_p95_ms or 0.0) <= TRADE_OFF_P95 * objective and _trades(w.tpot_miss_fraction, w.ttft_miss_fraction):
        return True
    few_missed = w.tpot_miss_fraction is not None and w.tpot_miss_fraction < SEVERE_MISSES
    near = (w.tpot_p95_ms or 0.0) <= SETTLED_TRADE_OFF_P95 * objective
    return few_missed and near and settled is not None and settled[1] > TTFT_MISS_TOLERANCE and _trades(*settled)


def _trades(tpot: float | None, ttft: float | None) -> bool:
    """Few TPOT misses, and no more of them than TTFT misses (``tpot_trade_off``)."""
    return tpot is not None and ttft is not None and tpot < REVERSAL_MIN_TPOT_MISSES and tpot <= ttft


def tpot_margin(slo: SloSpec | None, w: KvWindow) -> bool:
    """True when raising is unlikely to break the TPOT objective (within 80% of it, or no objective)."""
    if slo is None or not slo.time_per_output_token_millis or not w.tpot_p95_ms:
        return True
    return w.tpot_p95_ms <= TPOT_HEADROOM * slo.time_per_output_token_millis


def pressure(slo: SloSpec | None, current: int, w: KvWindow) -> tuple[float, str] | None:
    """(share of requests that miss their TTFT, why) when the limit keeps requests waiting; else None.

    With a TTFT objective the share is measured, and only misses count: a queue that still meets the
    objective costs nothing, and a restart would. Without one (or without latency metrics), the waiting
    share stands in."""
    if slo is not None and slo.time_to_first_token_millis and w.ttft_miss_fraction is not None:
        misses = w.ttft_miss_fraction
        if misses <= TTFT_MISS_TOLERANCE:
            return None
        p95 = f"{w.ttft_p95_ms:.0f}ms" if w.ttft_p95_ms is not None else "unknown"
        return misses, (f"{misses:.0%} of requests miss the TTFT objective {slo.time_to_first_token_millis}ms "
                        f"(p95 {p95}), queue {w.mean_queued:.1f}")
    if w.mean_queued >= 1 or w.peak_queued >= max(2, current // 8):
        waiting_share = w.mean_queued / max(1e-9, w.mean_queued + w.mean_active)
        return waiting_share, f"{w.mean_queued:.1f} requests wait on average ({waiting_share:.0%} of those in flight)"
    return None


def needed(current: int, w: KvWindow, misses: float) -> int:
    """Little's law: the concurrency that serves the arrival rate (completions + queue growth), with margin.

    A queue held in front of the pods (a gateway, clients) does not show in their metrics; the share of
    requests missing the objective is then the better lower bound of the excess load."""
    cur = current
    if w.completion_rate <= 0:
        return math.floor(cur * MAX_RAISE_FACTOR)
    arrivals = w.completion_rate + max(0.0, w.queue_growth)
    by_rate = math.ceil(cur * arrivals / w.completion_rate * LITTLE_MARGIN)
    by_misses = math.ceil(cur * (1.0 + misses) * LITTLE_MARGIN)
    return max(by_rate, by_misses, math.ceil(cur * MIN_RAISE_FACTOR))


def kv_fit(w: KvWindow, target_u: float, default: int) -> int:
    """Requests the pool holds at the target utilization, from the blocks one request used (measured within
    one sample, so the peak of utilization and the peak of requests never come from different moments)."""
    per_request = w.blocks_per_request or (w.peak_used_blocks / max(1, w.peak_active))
    return math.floor(target_u * w.max_blocks / per_request) if per_request > 0 else default


def tpot_bound(slo: SloSpec | None, w: KvWindow, headroom: float = TPOT_HEADROOM) -> int | None:
    """The largest limit whose predicted p95 TPOT stays within ``headroom`` of the objective.

    Prediction: the fitted iteration latency at that batch, scaled by how much the observed p95 TPOT
    exceeds the fitted latency at today's batch (prefill interference, tails). None when unknown."""
    if slo is None or not slo.time_per_output_token_millis:
        return None
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or b <= 0:
        return None
    at_now = a + b * max(1.0, w.mean_generation)
    if at_now <= 0:
        return None  # a least-squares intercept below zero: no latency to scale the objective by
    ratio = max(1.0, (w.tpot_p95_ms or at_now) / at_now)
    budget = headroom * slo.time_per_output_token_millis / ratio
    return max(1, math.floor((budget - a) / b))


def restart_load(slo: SloSpec | None, current: int, w: KvWindow) -> float:
    """How much of the capacity the pods have WITHIN THE OBJECTIVES their traffic uses (1 = none to spare): what
    a restart without surge costs, since the pods left carry the share of the one restarting (costs.py).

    ``load`` measures against the limit, and a limit far above the batch that runs (TensorRT-LLM's default 2048)
    reads as room the pods do not have: the KV pool, or the TPOT objective, bounds the batch first. Measured on
    the suite without a spare GPU (docs/tuner-suite.md, eighth pass): from 2048, lowers priced at a tenth of their
    restart (290 requests running under a limit of 2048) cost four rows 3-8% of their goodput, each restart
    leaving one pod to serve twice its traffic. So: requests that queue or miss TTFT, or a broken TPOT objective,
    mean no room (1); else the load against the smallest of the limit, the requests the pool holds and the batch whose
    fitted step latency meets the TPOT objective."""
    if w.mean_queued >= 1 or slo_broken(slo, w) is not None or pressure(slo, current, w) is not None:
        return 1.0
    capacity = min(max(1, current), kv_fit(w, 1.0, current))
    bound = tpot_bound(slo, w, headroom=1.0)
    if bound is not None:
        capacity = min(capacity, bound)
    return load(max(1, capacity), w)


def load(current: int, w: KvWindow) -> float:
    """How much of a pod's capacity at the current limit its traffic uses (1 = saturated).

    Batch occupancy (requests in flight over the limit) overstates headroom at large limits, where each
    extra request slows every iteration. With the fitted step latency t(c) = a + b*c, decode throughput is
    c / t(c), so the load is (c / t(c)) / (B / t(B))."""
    cur, c = max(1, current), max(0.0, w.mean_active)
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or a <= 0 or b <= 0:
        return min(1.0, c / cur)
    return min(1.0, (c / (a + b * c)) / (cur / (a + b * cur)))


def capacity_gain(w: KvWindow, cur: int, new: int) -> float:
    """Decode throughput at limit ``new`` over that at ``cur`` (B / t(B)); the limit's own ratio when unfitted."""
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or a <= 0 or b <= 0:
        return new / max(1, cur)
    return (new / (a + b * new)) / (cur / (a + b * cur))


def limit_in_force(w: KvWindow, rendered: int = 0, pipeline_parallel: int = 1) -> int:
    """The runtime max_batch_size the pods run with, per executor; 0 when unknown.

    * Where the release reports it (``maxBatchSizeRuntime``, the TensorRT backend's executor; with its in-engine
      tuner that is the tuner's value): that.
    * The PyTorch backend leaves the maxBatchSize* fields at 0 and reports only its cap on active requests,
      ``maxNumActiveRequests`` = max_batch_size x PP. The limit in force is then the one kvpilot rendered
      (``rendered``, status.batching), which that cap confirms or says nothing against; a cap that contradicts it
      (another engine's pod, a hostile reply) is not believed over what kvpilot wrote into the pods' config.
    * Nothing rendered known (the benchmark, a hand-made window): the cap over PP, when it divides evenly."""
    if w.runtime_batch_size > 0:
        return w.runtime_batch_size
    if rendered > 0:
        return rendered
    pp = max(1, pipeline_parallel)
    return w.active_limit // pp if w.active_limit > 0 and w.active_limit % pp == 0 else 0


def waiting_beside_full_batch(w: KvWindow, rendered: int = 0, pipeline_parallel: int = 1) -> bool:
    """Requests waited (a mean queue of one or more) while the batch was full: the evidence that the limit, not
    the pool or the traffic, kept them waiting.

    Full is judged against the pods' own limit where they report one: ``maxBatchSizeRuntime`` (TensorRT), else
    PyTorch's ``maxNumActiveRequests`` sample by sample (requests queued in the same sample that had the batch at
    the cap: ``full_waiting_share``), provided that cap is what kvpilot rendered (``rendered`` x PP) or nothing
    was rendered. A cap that contradicts the rendered limit (0, a foreign pod, an absurd value) is not evidence:
    the batch is then judged against the rendered limit, as if the pods had said nothing."""
    if w.mean_queued < 1:
        return False
    if w.runtime_batch_size > 0:
        return w.peak_active >= w.runtime_batch_size
    pp = max(1, pipeline_parallel)
    if w.active_limit > 0 and (rendered <= 0 or w.active_limit == rendered * pp):
        return w.full_waiting_share > 0
    return rendered > 0 and w.peak_active >= rendered * pp
