"""Model-predictive check of a proposed change: "what if" the limit moved, simulated with kvsim before acting.

The policy's rules propose a change; this module replays the traffic the pods saw (fitted from the window:
arrival rate, prompt and output lengths) on the same engine model the benchmark uses (kvsim, as a library),
twice with the same random stream: staying put, and rolling to the candidate (the rolling restart included,
with the rollout strategy in force). The change goes ahead only when the candidate's goodput over the
planning horizon beats staying put by ``MARGIN``. Deterministic (seeded), so the policy stays a pure
function of its input; its CPU cost is bounded by ``MAX_REQUESTS`` simulated requests per candidate.

It needs a kvsim profile for the pods' model and GPU: the simulated backend names one; for a real engine the
tuner falls back to its rules alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

from kvsim import EngineConfig, Request
from kvsim.config import CapacityPolicy
from kvsim.workload import Phase

from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.window import KvWindow

MARGIN = 0.03  # the candidate must beat staying put by 3% of goodput over the horizon
WARMUP_SECONDS = 120.0  # simulated at the current limit first, so the candidate starts from a loaded fleet
SHED_SHARE = 0.5  # of the TTFT objective: see Engine.queue_timeout_s
MAX_REQUESTS = 6000  # per simulated run
# Per decision: staying put and every candidate share this many simulated requests (each run gets at most
# MAX_REQUESTS), so one decision's cost is bounded whatever the rate or the number of candidates (its measured
# cost: docs/tuner-suite.md, "How the tuner decides now").
DECISION_BUDGET_REQUESTS = 30000
STEADY_SECONDS = 240.0  # simulated traffic per candidate
SEED = 8


@dataclass(frozen=True)
class TrafficFit:
    """What the window says about the traffic of the whole fleet (lognormal lengths around the means).
    ``arrival_cv``: the inter-arrival gaps' coefficient of variation (autotune/burst.py); 1 is Poisson."""

    rate_per_s: float
    prompt_mean: float
    output_mean: float
    max_tokens: int
    arrival_cv: float = 1.0


@dataclass(frozen=True)
class Engine:
    """What the simulation needs to know about the served engine."""

    profile: str
    ceiling: int
    scheduler_policy: str
    replicas: int
    restart_seconds: float
    surge: bool
    ttft_ms: float
    tpot_ms: float
    # The simulated gateway sheds a request not scheduled within this many seconds (SHED_SHARE of the TTFT
    # objective). The simulation then measures what each limit serves in time, its capacity under the SLO:
    # without shedding, a first-come-first-served queue near saturation fills to the client timeout and every
    # limit short of ample capacity scores ~0, so the comparison would measure the queue, not the limit.
    queue_timeout_s: float | None = None
    max_surge: int = 1  # with surge: pods started at once (the spare GPUs; the whole rollout when all fit)


def fit_traffic(w: KvWindow) -> TrafficFit | None:
    """The fleet's arrival rate and length means from the window; None when the window has no such data."""
    rate = w.arrival_rate * max(1, w.pods)
    if rate <= 0 or w.prompt_mean <= 0 or w.output_mean <= 0:
        return None
    cv = w.arrival_cv if w.arrival_cv is not None and math.isfinite(w.arrival_cv) and w.arrival_cv > 0 else 1.0
    return TrafficFit(rate, w.prompt_mean, w.output_mean, max(int(w.max_tokens_mean), int(w.output_mean) + 1), cv)


def candidates(current: int, target: int, lo: int, hi: int) -> list[int]:
    """The rules' target and the steps a doubling ladder offers in the same direction, within the bounds (a
    lower also halves the target: protective lowers are sized from the batch that runs, which may still be
    too large when prefills, not the batch, break TPOT)."""
    if target > current:
        ladder = [current * 2, current * 4, current * 8]
    else:
        ladder = [current // 2, target // 2]
    return sorted({max(lo, min(hi, c)) for c in [target, *ladder]} - {current})


def _requests(fit: TrafficFit, duration_s: float) -> list[Request]:
    import random

    rng = random.Random(SEED)
    out: list[Request] = []
    t = 0.0
    sigma = 0.8  # a typical chat/completion spread (median ~ 0.7 x mean)
    # kvsim's own arrival process (the benchmark's workloads use it): Poisson at cv 1, the very stream this
    # module drew before it fitted burstiness, else gamma gaps with the fitted cv, scaled so that exactly the
    # fitted rate arrives over the run (a few minutes of cv 3 gaps would otherwise offer +/-10% of it by chance).
    phase = Phase(duration_s, "poisson" if fit.arrival_cv == 1.0 else "gamma", fit.rate_per_s, fit.arrival_cv)
    pinned: list[float] = []
    if fit.arrival_cv != 1.0:
        n = min(2 * MAX_REQUESTS, round(fit.rate_per_s * duration_s))
        gaps = [phase.next_gap(rng, fit.rate_per_s) for _ in range(n + 1)]
        # When the request cap binds, the run is shorter than asked: pin the rate over the span n requests
        # take, not over the whole duration (which would stretch the gaps and simulate a lighter load).
        scale = min(duration_s, n / fit.rate_per_s) / sum(gaps)
        pinned = [g * scale for g in gaps]
    while True:
        t += pinned[len(out)] if pinned else phase.next_gap(rng, fit.rate_per_s)
        if t >= duration_s or len(out) >= 2 * MAX_REQUESTS or (pinned and len(out) + 1 >= len(pinned)):
            return out
        prompt = max(1, round(rng.lognormvariate(math.log(fit.prompt_mean) - sigma * sigma / 2, sigma)))
        output = max(1, round(rng.lognormvariate(math.log(fit.output_mean) - sigma * sigma / 2, sigma)))
        out.append(Request(prompt_tokens=prompt, output_tokens=min(output, fit.max_tokens),
                           max_tokens=fit.max_tokens, arrival_s=t, request_id=len(out)))


def _config(e: Engine, limit: int) -> EngineConfig:
    policy = CapacityPolicy.MAX_UTILIZATION if e.scheduler_policy == "MaxUtilization" \
        else CapacityPolicy.GUARANTEED_NO_EVICT
    return EngineConfig(profile=e.profile, build_max_batch_size=e.ceiling, max_batch_size=limit,
                        enable_chunked_context=True, capacity_policy=policy)


def goodput_after(e: Engine, fit: TrafficFit, current: int, candidate: int, horizon_s: float) -> float:
    """Requests per second meeting both objectives, of those arriving after the (possible) change."""
    horizon_s = min(horizon_s, MAX_REQUESTS / fit.rate_per_s)
    # Warm-up and horizon share the 2 x MAX_REQUESTS a run may draw: at a high rate a full warm-up alone would
    # use them all, and the candidate would never be rolled.
    warmup = min(WARMUP_SECONDS, MAX_REQUESTS / fit.rate_per_s)
    requests = _requests(fit, warmup + horizon_s)
    fleet = Fleet(_config(e, current), e.replicas, e.restart_seconds, surge=e.surge,
                  queue_timeout_s=e.queue_timeout_s, max_surge=e.max_surge)
    rolled = candidate == current
    for req in requests:
        if not rolled and req.arrival_s >= warmup:
            fleet.advance(warmup)
            fleet.roll_to(_config(e, candidate))
            rolled = True
        _advance(fleet, req.arrival_s)
        fleet.submit(req)
    _advance(fleet, warmup + horizon_s + 60.0)
    good = sum(1 for r in fleet.records
               if r.arrival_s >= warmup and r.finish_s is not None and r.ttft_s is not None
               and r.ttft_s * 1e3 <= e.ttft_ms and (r.tpot_s is None or r.tpot_s * 1e3 <= e.tpot_ms))
    return good / horizon_s


def _advance(fleet: Fleet, t: float) -> None:
    while fleet.next_transition() < t:
        fleet.advance(fleet.next_transition())
    fleet.advance(t)


GRID = 0.025  # the fit is rounded to a 2.5% log grid, so a steady traffic hits the cache window after window
CV_GRID = 0.25  # the arrival cv to the nearest quarter: its estimate scatters by ~+/-0.5 at cv 3 anyway


def quantized(fit: TrafficFit) -> TrafficFit:
    """The fit on a 2.5% grid: traffic that barely moved replays the same simulation (from the cache)."""
    def q(x: float) -> float:
        return round(math.exp(round(math.log(x) / GRID) * GRID), 3)

    cv = max(CV_GRID, round(fit.arrival_cv / CV_GRID) * CV_GRID)
    return TrafficFit(q(fit.rate_per_s), q(fit.prompt_mean), q(fit.output_mean), fit.max_tokens, cv)


def requests_per_run(runs: int) -> int:
    """Simulated requests each of ``runs`` runs of one decision may use (DECISION_BUDGET_REQUESTS shared)."""
    return max(1000, min(MAX_REQUESTS, DECISION_BUDGET_REQUESTS // max(1, runs)))


@lru_cache(maxsize=512)
def steady_goodput(e: Engine, fit: TrafficFit, limit: int, max_requests: int = MAX_REQUESTS) -> float:
    """Good requests per second at ``limit`` once the fleet is loaded (no restart): the fitted traffic for
    STEADY_SECONDS (fewer at high rates: ``max_requests`` bounds the CPU), counted after the first fifth.
    Memoized (pure: seeded traffic, the same engine model)."""
    duration = min(STEADY_SECONDS, max_requests / fit.rate_per_s)
    requests = _requests(fit, duration)
    fleet = Fleet(_config(e, limit), e.replicas, e.restart_seconds, queue_timeout_s=e.queue_timeout_s)
    for req in requests:
        fleet.advance(req.arrival_s)
        fleet.submit(req)
    fleet.advance(duration + 60.0)
    start = duration / 5
    good = sum(1 for r in fleet.records
               if r.arrival_s >= start and r.finish_s is not None and r.ttft_s is not None
               and r.ttft_s * 1e3 <= e.ttft_ms and (r.tpot_s is None or r.tpot_s * 1e3 <= e.tpot_ms))
    return good / (duration - start)


def choose(results: dict[int, float], stay: float, gains: dict[int, float], lost: float, current: int,
           margin: float = MARGIN, tpot_near: bool = False) -> int | None:
    """The candidate to roll to, from its simulated goodput (``results``), staying put's (``stay``), its gain
    over the horizon (``gains``) and the good requests the restart spoils (``lost``); None: stay.

    Within 1% of the best (the simulation's own noise): a lower takes the mildest, and so does a raise near
    the TPOT objective (``tpot_near``: a larger batch the model scores as equal only adds TPOT risk); a raise
    with TPOT headroom takes the largest (the fit under-counts long outputs still in flight, so capacity to
    spare is the safer error)."""
    ok = [c for c in results if results[c] > stay * (1 + margin) + 1e-9 and gains[c] > lost]
    if not ok:
        return None
    top = max(results[c] for c in ok)
    near = [c for c in ok if results[c] >= 0.99 * top]
    if tpot_near:
        return min(near, key=lambda c: abs(math.log(c / current)))
    return max(near)


def verdict(e: Engine, w: KvWindow, current: int, candidates: list[int], restart_cost_s: float,
            horizon_s: float, margin: float = MARGIN, tpot_near: bool = False) -> tuple[int | None, str]:
    """The candidate whose gain over staying put, over the horizon left once the rollout is done, exceeds the
    good requests the restart spoils (``restart_cost_s`` seconds of the good traffic, from the policy's cost
    model for the rollout in force) and beats staying put by ``margin``; None when no candidate does. Also the
    figures and the CPU it took. Without a traffic fit: None with the reason "no traffic fit"."""
    fit = fit_traffic(w)
    if fit is None:
        return None, "no traffic fit"
    # Deterministic in its inputs, so memoizing it keeps the policy a pure function; a steady traffic then
    # costs one simulation per candidate, not one per window.
    fit = quantized(fit)
    started = time.process_time()
    others = [c for c in candidates if c != current]
    budget = requests_per_run(1 + len(others))
    stay = steady_goodput(e, fit, current, budget)
    results = {c: steady_goodput(e, fit, c, budget) for c in others}
    cpu = time.process_time() - started
    rollout_s = e.replicas * e.restart_seconds
    lost = restart_cost_s * stay
    gains = {c: (g - stay) * max(0.0, horizon_s - rollout_s) for c, g in results.items()}
    best = choose(results, stay, gains, lost, current, margin, tpot_near)
    tried = ", ".join(f"{results[c]:.2f} at {c}" for c in sorted(results))
    burst = f", arrival cv {fit.arrival_cv:.2f}" if fit.arrival_cv != 1.0 else ""
    why = (f"simulated {fit.rate_per_s:.1f} req/s{burst} (prompt {fit.prompt_mean:.0f}, output {fit.output_mean:.0f} tokens): "
           f"goodput {stay:.2f} staying at {current}; {tried}; the restart spoils ~{lost:.0f} good requests "
           f"({cpu:.1f} CPU-s)")
    return best, why
