"""Model-predictive check of a proposed change: "what if" the limit moved, simulated with kvsim before acting.

The policy's rules propose a change; this module replays the traffic the pods saw (fitted from the window:
arrival rate, prompt and output lengths) on the same engine model the benchmark uses (kvsim, as a library),
twice with the same random stream: staying put, and rolling to the candidate (the rolling restart included,
with the rollout strategy in force). The change goes ahead only when the candidate's goodput over the
planning horizon beats staying put by ``MARGIN``. Deterministic (seeded), so the policy stays a pure
function of its input; its CPU cost is bounded by ``MAX_REQUESTS`` simulated requests per candidate.

It simulates the engine the pods run, not the datasheet: ``Engine.profile`` is a kvsim profile name or a
``kvsim.Profile`` calibrated to the pods' own metrics (``autotune/calibrate.py``, ``autotune/engine_model.py``),
and ``Engine.model_error`` says how far that model is from what the pods show. Among candidates the model scores
within its own error of each other, it prefers the one with the most margin on the objectives (p95 TTFT and
TPOT against their objectives), not the largest: a model 20% off cannot tell 256 from 512 on a TPOT cliff.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from kvsim import EngineConfig, Profile, RequestRecord, get_profile
from kvsim.config import Backend, CapacityPolicy
from kvsim.memory import plan_for

from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.replay import MAX_REQUESTS, TrafficFit, cap_bounds, fit_traffic, quantized, replayed_requests
from kvpilot.autotune.robust import EDGE_GIVE, YOUNG_ERROR, least_regret, off_the_edge, paid_back, paying_gain
from kvpilot.autotune.window import KvWindow

MARGIN = 0.03  # the candidate must beat staying put by 3% of goodput over the horizon
WARMUP_SECONDS = 120.0  # simulated at the current limit first, so the candidate starts from a loaded fleet
SHED_SHARE = 0.5  # of the TTFT objective: see Engine.queue_timeout_s
# Per decision: staying put and every candidate share this many simulated requests (each run gets at most
# MAX_REQUESTS), so one decision's cost is bounded whatever the rate or the number of candidates (its measured
# cost: docs/tuner-suite.md, "How the tuner decides now"). The robust choice's replays on a slower engine get
# the same share per candidate, and a change chosen with a placed max_tokens is replayed four more times (staying
# put and it, the cap one step lower and higher: ``_cap_shaky``), so a decision simulates at most 2.8x this many.
DECISION_BUDGET_REQUESTS = 30000
STEADY_SECONDS = 240.0  # simulated traffic per candidate
NOISE = 0.01  # the simulation's own noise: candidates within 1% of each other are equal even to an exact model
# The engine the robust choice also replays candidates on (``slower_engine``): every calibrated rate at this
# share of the model's (decode's HBM efficiency and prefill's MFU x0.8, the step and per-sequence overheads
# x1.25). The model is fitted at the limit in force and extrapolates to every other; kvsim's held-out error
# against NVIDIA's tables is 6.6% median and 28% at worst (../shared/reference/simulator-calibration.md), so a
# limit the pods never ran may well be served this much slower. Memory is not changed: the fitted model takes
# the pool from the pods' own maxNumBlocks.
SLOWER_RATE = 0.8


@dataclass(frozen=True)
class Engine:
    """What the simulation needs to know about the served engine. ``profile``: a kvsim profile name, or the
    profile calibrated to the pods (autotune/engine_model.py); ``model_error``: the model's relative error
    against what the pods show (0: taken as exact; candidates within max(NOISE, it) of the best are equals)."""

    profile: str | Profile
    ceiling: int
    scheduler_policy: str
    replicas: int
    restart_seconds: float
    surge: bool
    ttft_ms: float
    tpot_ms: float
    # The simulated gateway sheds a request not scheduled within this many seconds (SHED_SHARE of the TTFT objective).
    # The simulation then measures what each limit serves in time, its capacity under the SLO: without shedding, a
    # first-come-first-served queue near saturation fills to the client timeout and every limit short of ample
    # capacity scores ~0, so the comparison would measure the queue, not the limit.
    queue_timeout_s: float | None = None
    max_surge: int = 1  # with surge: pods started at once (the spare GPUs; the whole rollout when all fit)
    model_error: float = 0.0
    backend: str = "tensorrt"  # the pods' execution backend (pytorch or tensorrt; the simulated backend plays tensorrt)
    # The pods run TensorRT-LLM's in-engine batch-size tuner (batching.dynamicBatchSizeTuning, on by default, on the
    # TensorRT backend only): it caps the batch below max_batch_size, so a model without it predicts batches, and
    # misses, the pods never show.
    in_engine_tuner: bool = False


def sim_config(profile: str | Profile, ceiling: int, limit: int, scheduler_policy: str,
               backend: str = "tensorrt", in_engine_tuner: bool = False) -> EngineConfig:
    """The kvsim configuration the what-if simulates a pod with (engine_model.py inverts its memory plan to
    give the simulated pool the pods' own size). ``backend``: the pods' (pytorch: no engine build, CUDA-graph
    memory instead of the C++ runtime's per-slot buffers, kvsim.memory). ``in_engine_tuner``: the pods' in-engine
    batch-size tuner (TensorRT only; kvsim refuses it on PyTorch, as TensorRT-LLM does)."""
    policy = CapacityPolicy.MAX_UTILIZATION if scheduler_policy == "MaxUtilization" \
        else CapacityPolicy.GUARANTEED_NO_EVICT
    pytorch = backend == "pytorch"
    return EngineConfig(profile=profile, build_max_batch_size=ceiling, max_batch_size=limit,
                        enable_chunked_context=True, capacity_policy=policy,
                        enable_batch_size_tuning=in_engine_tuner and not pytorch,
                        backend=Backend.PYTORCH if pytorch else Backend.TENSORRT)


def _config(e: Engine, limit: int) -> EngineConfig:
    return sim_config(e.profile, e.ceiling, limit, e.scheduler_policy, e.backend, e.in_engine_tuner)


def goodput_after(e: Engine, fit: TrafficFit, current: int, candidate: int, horizon_s: float) -> float:
    """Requests per second meeting both objectives, of those arriving after the (possible) change."""
    horizon_s = min(horizon_s, MAX_REQUESTS / fit.rate_per_s)
    # Warm-up and horizon share the 2 x MAX_REQUESTS a run may draw: at a high rate a full warm-up alone would
    # use them all, and the candidate would never be rolled.
    warmup = min(WARMUP_SECONDS, MAX_REQUESTS / fit.rate_per_s)
    requests = replayed_requests(fit, warmup + horizon_s)
    fleet = Fleet(_config(e, current), e.replicas, e.restart_seconds, surge=e.surge,
                  queue_timeout_s=e.queue_timeout_s, max_surge=e.max_surge, iteration_stats=False)
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


def requests_per_run(runs: int) -> int:
    """Simulated requests each of ``runs`` runs of one decision may use (DECISION_BUDGET_REQUESTS shared)."""
    return max(1000, min(MAX_REQUESTS, DECISION_BUDGET_REQUESTS // max(1, runs)))


@dataclass(frozen=True)
class Outcome:
    """What one simulated limit serves: good requests per second, and the p95 TTFT and TPOT of those served
    (milliseconds; None when none was served), which say how much margin it leaves on the objectives."""

    goodput: float
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    def margin(self, e: Engine) -> float:
        """The smaller relative margin left on the objectives: 1 - p95 / objective (objectives not set count
        as ample; nothing served counts as none)."""
        if self.ttft_p95_ms is None:
            return 0.0
        margins = [1.0 - p95 / slo for p95, slo in ((self.ttft_p95_ms, e.ttft_ms), (self.tpot_p95_ms, e.tpot_ms))
                   if math.isfinite(slo) and slo > 0 and p95 is not None]
        return min(margins, default=1.0)


@lru_cache(maxsize=512)
def steady_run(e: Engine, fit: TrafficFit, limit: int, max_requests: int = MAX_REQUESTS) -> Outcome:
    """The fitted traffic at ``limit`` once the fleet is loaded (no restart), for STEADY_SECONDS (fewer at
    high rates: ``max_requests`` bounds the CPU), counted after the first fifth. Memoized (pure: seeded
    traffic, the same engine model)."""
    duration = min(STEADY_SECONDS, max_requests / fit.rate_per_s)
    fleet = Fleet(_config(e, limit), e.replicas, e.restart_seconds, queue_timeout_s=e.queue_timeout_s,
                  iteration_stats=False)
    for req in replayed_requests(fit, duration):
        fleet.advance(req.arrival_s)
        fleet.submit(req)
    fleet.advance(duration + 60.0)
    start = duration / 5
    served = [r for r in fleet.records if r.arrival_s >= start and r.finish_s is not None and r.ttft_s is not None]
    good = sum(1 for r in served if _good(r, e))
    return Outcome(good / (duration - start), _p95([r.ttft_s for r in served if r.ttft_s is not None]),
                   _p95([r.tpot_s for r in served if r.tpot_s is not None]))


def steady_goodput(e: Engine, fit: TrafficFit, limit: int, max_requests: int = MAX_REQUESTS) -> float:
    """Good requests per second at ``limit`` once the fleet is loaded (``steady_run``'s goodput)."""
    return steady_run(e, fit, limit, max_requests).goodput


def _good(r: RequestRecord, e: Engine) -> bool:
    return r.ttft_s is not None and r.ttft_s * 1e3 <= e.ttft_ms and (r.tpot_s is None or r.tpot_s * 1e3 <= e.tpot_ms)


def _p95(values_s: list[float]) -> float | None:
    if not values_s:
        return None
    ordered = sorted(values_s)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1e3


def choose(results: dict[int, Outcome], stay: Outcome, gains: dict[int, float], lost: float, current: int,
           e: Engine, margin: float = MARGIN, slower: dict[int, Outcome] | None = None,
           with_error: bool = True, ahead: bool = False) -> int | None:
    """The candidate to roll to, from its simulated outcome (``results``), staying put's (``stay``), its gain
    over the horizon (``gains``) and the good requests the restart spoils (``lost``); None: stay.

    The model is only as good as its error (``e.model_error``, at least the simulation's NOISE): a candidate
    must beat staying put by the larger of ``margin`` and that error. The model is fitted at the limit in force
    and extrapolates to the others, so the choice then asks which option survives the model being wrong:
    ``slower`` holds staying put and those candidates replayed on an engine slower than the model
    (``slower_engine``), and the options whose worst regret over the two engines (the shortfall from the best
    option on that engine) is within that error of the least are kept (minimax regret). Staying put among them
    means no change; else the largest of them, capacity to spare (the traffic fit under-counts long outputs still
    in flight; verdict replays raises only). Issue 18: on an engine slower than its model, 104, 128, 256 and 512
    scored alike and the model alone took 512, where the pods broke TPOT; replayed slower, 104 queued and 512 fell
    off the cliff, so 256 (the best static value) was kept. A raise the model wants by 4% that serves a tenth on
    the slower engine, where staying put holds, is no robust gain (nor one whose restart never pays back there:
    ``robust.paid_back``). Without surge the gain that pays the restart is the one left once the model's error is
    taken off the candidate, and it must pay NO_SURGE_PAYBACK times (``robust.paying_gain``).

    Without the replay (none was given, or its memory plan refused an option), among the candidates within that
    error of the best the one with the most margin on the objectives wins (p95 TTFT and TPOT against their
    objectives, margins within the same error counting as equal), and among equal margins the largest. Ranked on
    traffic carried ``ahead`` of the window, a choice that misses an objective in the model gives way to one that
    meets them all (``robust.off_the_edge``)."""
    error = max(0.0, e.model_error) if math.isfinite(e.model_error) else 1.0

    def pays(c: int) -> float:  # a lower keeps the whole gain: most are protective, sized by the model
        return paying_gain(gains[c], results[c].goodput, stay.goodput, error, e.surge, with_error) \
            if c > current else gains[c]
    ok = [c for c in movers(results, stay, e, margin) if pays(c) > lost]
    if not ok:
        return None
    tolerance = max(NOISE, error)
    goodput, margins = {c: results[c].goodput for c in ok}, {c: results[c].margin(e) for c in ok}
    if slower is not None and all(c in slower for c in [current, *ok]):
        # Staying put is one of the options (a raise must also pay its restart back on the slower engine).
        ok = paid_back(ok, gains, lost, stay.goodput, goodput, {c: slower[c].goodput for c in [current, *ok]}, current)
        options = [current, *ok]
        model = {**results, current: stay}
        kept = least_regret(options, [{c: model[c].goodput for c in options}, {c: slower[c].goodput for c in options}],
                            tolerance)
        if current in kept:
            return None
        best, pool = max(kept), kept  # raises only: a lower, carried ahead or not, is never replayed slower
    else:
        near = least_regret(ok, [goodput], tolerance)
        widest = max(margins[c] for c in near)
        best, pool = max(c for c in near if margins[c] >= widest - tolerance), ok
    return off_the_edge(best, pool, goodput, margins) if ahead else best


def slower_engine(e: Engine) -> Engine:
    """``e`` with every calibrated rate at SLOWER_RATE of the model's (the pool and everything else unchanged)."""
    profile = get_profile(e.profile) if isinstance(e.profile, str) else e.profile
    cal = profile.calibration
    slow = replace(cal, hbm_efficiency=cal.hbm_efficiency * SLOWER_RATE, prefill_mfu=cal.prefill_mfu * SLOWER_RATE,
                   step_overhead_s=cal.step_overhead_s / SLOWER_RATE, per_sequence_s=cal.per_sequence_s / SLOWER_RATE)
    return replace(e, profile=replace(profile, calibration=slow))


def movers(results: dict[int, Outcome], stay: Outcome, e: Engine, margin: float) -> list[int]:
    """The candidates that beat staying put by the margin ``choose`` asks (the restart's cost aside): the ones
    worth replaying on ``slower_engine`` (with staying put) when they are raises."""
    error = max(0.0, e.model_error) if math.isfinite(e.model_error) else 1.0
    return [c for c in results if results[c].goodput > stay.goodput * (1 + max(margin, error)) + 1e-9]


# The reason verdict gives when kvsim's memory plan cannot place the limit in force on the model (a calibrated
# profile whose memory a capped or mislabelled pool sized wrongly, a template far from the engine): the model is
# then unusable this pass and the rules decide alone, as for an engine without one.
UNPLACEABLE = "the model cannot place the limit in force"
# The note verdict adds when only a young model's error (robust.YOUNG_ERROR) kept a raise from paying its restart.
ERROR_EATS_GAIN = "the gain the model's error leaves does not pay a restart without surge; the fit narrows it"


class Decline(StrEnum):
    """Why ``verdict`` chose no candidate; the policy acts on this, never on the message's wording."""

    NO_FIT = "NoTrafficFit"  # the window holds no traffic to replay: the rules decide alone
    UNPLACEABLE = "Unplaceable"  # kvsim's memory plan refuses the limit in force: the model is unusable this pass
    # Only a young model's error kept the gain from paying: such a fit narrows within minutes, so the simulation
    # reruns at the next proposal (the cap check, ``_cap_shaky``, is not asked first: at worst one more run).
    YOUNG_ERROR = "YoungError"
    # No candidate pays its restart (or the one that did failed the cap check, ``_cap_shaky``): a change the model
    # may veto is held until the policy's recheck period; a protective one goes ahead all the same.
    NO_GAIN = "NoGain"


class WhatIf(NamedTuple):
    """The what-if's answer: the candidate to move to (None: stay), the figures as the decision's message
    reads them, and why none was chosen (None when one was; the policy reads a missing reason as NO_GAIN, so a
    verdict that forgets it holds rather than lets the rules' change through unvetted)."""

    best: int | None
    why: str
    decline: Decline | None = None
    # How far staying put scores above the best candidate tried, as a share of staying put (0 where one scores
    # as well or higher, or none was tried): a decline with a lead past the model's error is a verdict, not a tie.
    lead: float = 0.0
    # The chosen candidate's goodput above staying put's, as a share of the traffic replayed (None: none chosen,
    # or not known): the points of requests served in time the change is predicted to win.
    gain: float | None = None


def unplaceable(e: Engine, limit: int) -> str | None:
    """Why kvsim's memory plan cannot place ``limit`` on the model (None: it can). Numbers only, no simulation."""
    try:
        plan_for(_config(e, limit).resolved())
    except ValueError as exc:
        return f"{UNPLACEABLE} ({exc})"
    return None


def _placed(e: Engine, fit: TrafficFit, limit: int, budget: int) -> Outcome | str:
    """The steady run at ``limit``, or why kvsim's memory plan refuses that configuration of the model (a
    candidate that does not fit the modelled GPU is no candidate; it never reaches a served pod)."""
    try:
        return steady_run(e, fit, limit, budget)
    except ValueError as exc:
        return str(exc)


def _slower_runs(e: Engine, fit: TrafficFit, candidates: list[int], budget: int) -> dict[int, Outcome] | None:
    """``candidates`` replayed on ``slower_engine``; None when its memory plan refuses one (no robust choice)."""
    slow = slower_engine(e)
    runs = {c: _placed(slow, fit, c, budget) for c in candidates}
    out = {c: o for c, o in runs.items() if not isinstance(o, str)}
    return out if len(out) == len(runs) else None


def verdict(e: Engine, w: KvWindow, current: int, candidates: list[int], restart_cost_s: float,
            horizon_s: float, margin: float = MARGIN, for_gain: bool = True, ahead: bool = False) -> WhatIf:
    """The candidate whose gain over staying put, over the horizon left once the rollout is done, exceeds the
    good requests the restart spoils (``restart_cost_s`` seconds of the good traffic, from the policy's cost
    model for the rollout in force) and beats staying put by ``margin`` (or the model's error, if larger);
    None when no candidate does (``WhatIf.decline`` says why). Also the figures and the CPU it took. The choice
    among equals reads the margin on the objectives from each candidate's own simulated p95s (``choose``). A
    change ``for_gain`` (not one the measurements call for, which the model may resize but not veto) must also
    hold where the placed max_tokens is off by its error (``_cap_shaky``). Without surge a raise pays its restart
    only from what the model's error leaves of its gain, 1.5 times over (``robust.paying_gain``); the reason then
    ends with ERROR_EATS_GAIN (the decline is YOUNG_ERROR) where a young model's error alone declined it. ``ahead``:
    ``w`` holds traffic carried on ahead of the pods' window (autotune/ahead.py), for ``choose``."""
    fit = fit_traffic(w)
    if fit is None:
        return WhatIf(None, "no traffic fit", Decline.NO_FIT)
    # Deterministic in its inputs, so memoizing keeps the policy pure (a steady traffic: one simulation per candidate).
    fit = quantized(fit)
    started = time.process_time()
    others = [c for c in candidates if c != current]
    budget = requests_per_run(1 + len(others))
    stay = _placed(e, fit, current, budget)
    if isinstance(stay, str):
        return WhatIf(None, f"{UNPLACEABLE} ({stay})", Decline.UNPLACEABLE)
    placed = {c: _placed(e, fit, c, budget) for c in others}
    results = {c: o for c, o in placed.items() if not isinstance(o, str)}
    rollout_s = e.replicas * e.restart_seconds
    lost = restart_cost_s * stay.goodput
    gains = {c: (o.goodput - stay.goodput) * max(0.0, horizon_s - rollout_s) for c, o in results.items()}
    # Only a raise is replayed slower: it moves the batch where the pods never ran it, towards the TPOT cliff. A
    # lower (most are protective) shrinks it towards what was measured; replayed slower under a tight TPOT
    # objective every small limit breaks it, and minimax then chose 42 over 59 on an exact model (2% error),
    # 20.7 req/s over the run where 59 serves 24.7 (tight-tpot-overload.pytorch from 2048).
    moving = [c for c in movers(results, stay, e, margin) if c > current]
    slow = _slower_runs(e, fit, [current, *moving], budget) if moving else None
    best = choose(results, stay, gains, lost, current, e, margin, slow, ahead=ahead)
    young = best is None and e.model_error > YOUNG_ERROR \
        and choose(results, stay, gains, lost, current, e, margin, slow, with_error=False) is not None
    shaky = _cap_shaky(e, fit, current, best, horizon_s - rollout_s, restart_cost_s, budget) \
        if best is not None and for_gain else None
    best = None if shaky else best
    edge = choose(results, stay, gains, lost, current, e, margin, slow) if ahead and best is not None else best
    stepped = (f"; {edge} misses an objective at p95 on the traffic carried ahead: {best} meets them all and scores "
               f"within {EDGE_GIVE:.0%} of it") if edge != best else ""
    tried = ", ".join(f"{results[c].goodput:.2f} at {c} (margin {results[c].margin(e):.0%})" for c in sorted(results))
    if slow:
        tried += "; on an engine 20% slower: " + ", ".join(
            f"{slow[c].goodput:.2f} {'staying at' if c == current else 'at'} {c}" for c in sorted(slow))
    burst = f", arrival cv {fit.arrival_cv:.2f}" if fit.arrival_cv != 1.0 else ""
    error = f"; model error {e.model_error:.0%}" if e.model_error > NOISE else ""
    cap = f", max_tokens placed at {fit.max_tokens}" if fit.max_tokens else ""
    why = (f"simulated {fit.rate_per_s:.1f} req/s{burst} (prompt {fit.prompt_mean:.0f}, output {fit.output_mean:.0f} tokens"
           f"{cap}): goodput {stay.goodput:.2f} staying at {current}; {tried}; the restart spoils ~{lost:.0f} good "
           f"requests{error}{stepped}{'; ' + shaky if shaky else ''}{'; ' + ERROR_EATS_GAIN if young else ''} "
           f"({time.process_time() - started:.1f} CPU-s)")
    top = max((o.goodput for o in results.values()), default=stay.goodput)
    lead = max(0.0, 1.0 - top / stay.goodput) if stay.goodput > 0 else 0.0
    gain = (results[best].goodput - stay.goodput) / fit.rate_per_s if best is not None and fit.rate_per_s > 0 else None
    return WhatIf(best, why, None if best is not None else Decline.YOUNG_ERROR if young else Decline.NO_GAIN, lead,
                  gain)


def _cap_shaky(e: Engine, fit: TrafficFit, current: int, best: int, seconds: float, restart_cost_s: float,
               budget: int) -> str | None:
    """Why the change to ``best`` does not hold where the placed cap is off by its error (``replay.cap_bounds``):
    at either bound its gain over ``seconds`` must still pay back the restart; None when it holds. Measured on
    the suite's long-output case on an engine decoding 30% slower, from 2048 (docs/tuner-suite.md, "Twelfth
    pass"): with the cap placed ~4% high, the model admitted fewer requests at 1024 than the pods would and put
    its p95 TPOT 1% inside the objective; the lower went, the pods broke TPOT at 1024, and the protective lower
    that followed cost 6% of the run."""
    for bound in cap_bounds(fit):
        stay, moved = _placed(e, bound, current, budget), _placed(e, bound, best, budget)
        if isinstance(stay, str) or isinstance(moved, str):
            return f"the model cannot place it with max_tokens {bound.max_tokens}"
        if (moved.goodput - stay.goodput) * max(0.0, seconds) <= restart_cost_s * stay.goodput:
            return (f"with max_tokens at {bound.max_tokens} (the placed cap's error) {best} serves "
                    f"{moved.goodput:.2f} where staying serves {stay.goodput:.2f}: no change")
    return None
