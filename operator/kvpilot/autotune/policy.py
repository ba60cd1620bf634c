"""The autotuner's policy: raise, lower or hold the runtime max_batch_size. Pure, table-tested.

What an engineer does by hand — "start at 64, watch memory, raise slowly" — with the care expensive GPUs
need: every applied change restarts the pods, so the tuner only moves when the signal is clear
(hysteresis), the move is worth a restart (minimum step), enough time has passed (cooldown) and nothing is
rolling out. It reads the signals TensorRT-LLM actually gives:

* under GUARANTEED_NO_EVICT admission is bound by *reserved* blocks (prompt + max_tokens), so a queue with a
  batch below its limit and low utilization is not headroom: raising the limit would admit nobody;
* a full batch with a queue and KV headroom is the case where a higher limit helps;
* paused requests (MAX_UTILIZATION) or a pool above target mean the batch is too large for memory;
* a TPOT objective that is broken means the batch is too large for latency.

Traffic changes, so a change may later be undone, but never by flapping: never back to a value left within a
planning horizon, past it only on strong evidence of the opposite kind, and at most one reversal per horizon
(``_oscillation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

from kvpilot.api.models import AutotuneSpec
from kvpilot.api.status import Action
from kvpilot.autotune.whatif import Engine as WhatIfEngine
from kvpilot.autotune.whatif import MARGIN as WHAT_IF_MARGIN
from kvpilot.autotune.whatif import candidates as what_if_candidates
from kvpilot.autotune.whatif import verdict as what_if_verdict
from kvpilot.autotune.window import KvWindow

HYSTERESIS = 0.05  # utilization band around the target where the tuner does not move
MIN_RELATIVE_STEP = 0.25  # smaller raises are not worth a pod restart
MIN_PROTECTIVE_STEP = 0.10  # lowering to protect memory or latency may be finer
MAX_RAISE_FACTOR = 2.0  # without a completion rate to size the step
MIN_RAISE_FACTOR = 1.5  # a raise that fixes misses must be a real step
MAX_STEP_FACTOR = 4.0  # never more than x4 in one change
LITTLE_MARGIN = 1.25  # headroom over the concurrency Little's law asks for
TTFT_MISS_TOLERANCE = 0.02  # fewer TTFT misses than this are noise, not a reason to restart
TPOT_HEADROOM = 0.8  # raise only while p95 TPOT is under 80% of its objective
TPOT_MISS_TOLERANCE = 0.05
PLANNING_HORIZON_SECONDS = 1800.0  # how long a change is assumed to pay off
SEVERE_MISSES = 0.5  # when half the requests miss, acting beats any restart cost
PROTECTIVE_REASONS = ("RequestsPaused", "KvCachePressure", "TpotObjectiveBroken")
PROACTIVE_MAX_LOAD = 0.5  # raise ahead of need only below half of what a restart can absorb
PROACTIVE_MIN_OCCUPANCY = 0.10  # below this the latency model has too little data to extrapolate
MAX_LOWER_FACTOR = 0.5
MIN_SAMPLES = 3
SATURATION = 0.95  # the batch counts as full when its peak reaches 95% of the limit
PROACTIVE_RAISES = False  # raising a limit that does not bind yet ("Headroom") is off: it is not do-no-harm
REVERSAL_MIN_TPOT_MISSES = 0.20  # a lower right after a raise needs this share of TPOT misses (or pauses)
REVERSAL_MIN_TTFT_MISSES = 0.20  # a raise past where a recent lower started needs this share of TTFT misses
UNDO_MIN_TPOT_MISSES = SEVERE_MISSES  # a lower past where a recent raise started needs this share of TPOT misses
LOWER_MARGIN = 2.0  # a protective lower must save twice what its restart costs
MIN_CAPACITY_GAIN = 1.10  # a raise must promise at least this much more decode throughput (fitted model)
# Once the simulation has declined a change the rules proposed, it reruns only this long after (or at once when
# most requests miss): the CPU bound per engine (docs/tuner-suite.md, "How the tuner decides now").
WHAT_IF_RECHECK_SECONDS = 120.0
# A raise while p95 TPOT is already near its objective must win the simulation by this many times its margin:
# the outcome then hinges on the tail of the output lengths, which the fit (means only) does not know.
# Measured on tight-tpot-overload (30 minutes): the simulation scored 96 +3.9% over 64, the rollout broke the
# 22 ms objective and the tuner had to lower again.
TPOT_NEAR_MARGIN_FACTOR = 2.0


@dataclass(frozen=True)
class AppliedChange:
    """One applied change of the runtime limit (status.autotune.history)."""

    at: datetime
    from_value: int
    to_value: int


@dataclass(frozen=True)
class TunerInput:
    current: int
    ceiling: int
    spec: AutotuneSpec
    window: KvWindow | None
    scheduler_policy: str
    rollout_in_progress: bool
    build_in_progress: bool
    last_applied_at: datetime | None
    now: datetime
    # The ceiling a rebuild may reach (the schema bound on build.maxBatchSize).
    rebuild_limit: int = 16384
    replicas: int = 1  # serving pods; a change restarts each of them in turn
    restart_seconds: float = 120.0  # measured start-to-Ready time of a pod (the cost of a change)
    build_seconds: float = 1200.0  # how long an engine build takes (the last one, when known)
    # Applied changes, newest first (from status.autotune.history): no A->B->A within a planning horizon.
    recent_changes: tuple[AppliedChange, ...] = ()
    # Pods that should be reporting (the serving replicas); a window from fewer is partial. 0: unknown.
    expected_pods: int = 0
    # The rollout strategy in force: with surge (maxSurge >= 1, maxUnavailable 0) capacity never drops.
    surge: bool = False
    # The engine model for a what-if simulation of a proposed change (kvsim; autotune/whatif.py). None: the
    # rules alone decide (a real engine whose model and GPU have no kvsim profile).
    what_if: WhatIfEngine | None = None
    # When the what-if simulation last ran and declined a change (status.autotune.whatIfDeclinedAt).
    declined_since: datetime | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    target: int  # the runtime max_batch_size to run with (== current for Hold)
    reason: str
    message: str
    ceiling_request: int | None = None  # for Rebuild: the engine ceiling to build
    simulated: bool = False  # the what-if simulation ran for this decision (status records when it declined)

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))  # "Raise" from a test or a log reads as Raise

    @property
    def changes(self) -> bool:
        return self.action != Action.HOLD


def bounds(inp: TunerInput) -> tuple[int, int]:
    hi = min(inp.spec.max_batch_size, inp.ceiling)
    lo = min(inp.spec.min_batch_size, hi)
    return lo, hi


def _hold(inp: TunerInput, reason: str, message: str) -> Decision:
    return Decision(Action.HOLD, inp.current, reason, message)


def _move(inp: TunerInput, target: int, reason: str, message: str, min_step: float = MIN_RELATIVE_STEP) -> Decision:
    lo, hi = bounds(inp)
    target = max(lo, min(hi, target))
    if target == inp.current:
        return _hold(inp, reason, message + f"; already at the bound {target}")
    if abs(target - inp.current) < min_step * inp.current:
        return _hold(inp, "ChangeTooSmall", message + f"; {inp.current}->{target} is not worth a restart")
    action = Action.RAISE if target > inp.current else Action.LOWER
    return Decision(action, target, reason, message + f"; {inp.current}->{target}")


def _slo_broken(inp: TunerInput, w: KvWindow) -> str | None:
    slo = inp.spec.slo
    if slo is None or not slo.time_per_output_token_millis:
        return None
    over = w.tpot_miss_fraction is not None and w.tpot_miss_fraction > TPOT_MISS_TOLERANCE
    if (w.tpot_p95_ms and w.tpot_p95_ms > slo.time_per_output_token_millis) or over:
        p95 = f"{w.tpot_p95_ms:.0f}ms" if w.tpot_p95_ms else "unknown"
        return f"p95 TPOT {p95} > objective {slo.time_per_output_token_millis}ms"
    return None


def _tpot_margin(inp: TunerInput, w: KvWindow) -> bool:
    """True when raising is unlikely to break the TPOT objective (within 80% of it, or no objective)."""
    slo = inp.spec.slo
    if slo is None or not slo.time_per_output_token_millis or not w.tpot_p95_ms:
        return True
    return w.tpot_p95_ms <= TPOT_HEADROOM * slo.time_per_output_token_millis


def _pressure(inp: TunerInput, w: KvWindow) -> tuple[float, str] | None:
    """(share of requests that miss their TTFT, why) when the limit keeps requests waiting; else None.

    With a TTFT objective the share is measured, and only misses count: a queue that still meets the
    objective costs nothing, and a restart would. Without one (or without latency metrics), the waiting
    share stands in."""
    slo = inp.spec.slo
    if slo is not None and slo.time_to_first_token_millis and w.ttft_miss_fraction is not None:
        misses = w.ttft_miss_fraction
        if misses <= TTFT_MISS_TOLERANCE:
            return None
        p95 = f"{w.ttft_p95_ms:.0f}ms" if w.ttft_p95_ms is not None else "unknown"
        return misses, (f"{misses:.0%} of requests miss the TTFT objective {slo.time_to_first_token_millis}ms "
                        f"(p95 {p95}), queue {w.mean_queued:.1f}")
    if w.mean_queued >= 1 or w.peak_queued >= max(2, inp.current // 8):
        waiting_share = w.mean_queued / max(1e-9, w.mean_queued + w.mean_active)
        return waiting_share, f"{w.mean_queued:.1f} requests wait on average ({waiting_share:.0%} of those in flight)"
    return None


def _needed(inp: TunerInput, w: KvWindow, misses: float) -> int:
    """Little's law: the concurrency that serves the arrival rate (completions + queue growth), with margin.

    A queue held in front of the pods (a gateway, clients) does not show in their metrics; the share of
    requests missing the objective is then the better lower bound of the excess load."""
    cur = inp.current
    if w.completion_rate <= 0:
        return math.floor(cur * MAX_RAISE_FACTOR)
    arrivals = w.completion_rate + max(0.0, w.queue_growth)
    by_rate = math.ceil(cur * arrivals / w.completion_rate * LITTLE_MARGIN)
    by_misses = math.ceil(cur * (1.0 + misses) * LITTLE_MARGIN)
    return max(by_rate, by_misses, math.ceil(cur * MIN_RAISE_FACTOR))


def _worth_a_restart(inp: TunerInput, w: KvWindow, misses: float, target: int,
                     horizon: float = PLANNING_HORIZON_SECONDS) -> tuple[bool, str]:
    """Misses avoided over the planning horizon against the misses a rolling restart adds (a fluid model).

    Restarting one of N pods takes 1/N of the capacity away for ``restart_seconds``, one pod after another.
    Traffic the others cannot absorb piles up as a backlog, which the new, larger capacity must then drain;
    requests arriving until it has drained wait too long. Capacity is assumed to grow at most in proportion
    to the limit (decode is memory-bound), so the estimate of the drain is optimistic only within x2."""
    if misses >= SEVERE_MISSES:
        return True, f"{misses:.0%} of requests already miss: a restart cannot make it worse for long"
    n = max(1, inp.replicas)
    load = 1.0 + misses if w.mean_queued >= 1 else _load(inp, w)
    growth = max(0.0, n * load - (n - 1))  # backlog growth while one pod restarts, in pod-capacities
    cost = 0.0
    if growth > 0:
        spare = n * min(target / inp.current, MAX_RAISE_FACTOR) - n * load
        if spare <= 0:
            return False, "the new limit could not drain the backlog a restart leaves"
        backlog = n * inp.restart_seconds * growth
        cost = (n * inp.restart_seconds + backlog / spare) * (1.0 - misses)
    benefit = max(0.0, horizon) * misses
    return benefit > cost, f"expected misses avoided {benefit:.0f}s vs caused {cost:.0f}s of traffic"


def restart_cost_seconds(inp: TunerInput, load: float) -> float:
    """Seconds of the fleet's traffic a rolling restart makes miss (a fluid model; the rollout in force).

    With surge (a new pod is Ready before an old one stops) capacity never drops: only the requests cut off
    or slowed by the switch count, about a tenth of a restart per pod. Without surge, each of the N pods is
    down ``restart_seconds`` in turn; the others carry (N-1)/N of the capacity, so the share of traffic over
    that misses while one pod is down, and about as long again while the backlog drains."""
    n = max(1, inp.replicas)
    per_pod = inp.restart_seconds
    if inp.surge:
        return 0.1 * per_pod * n
    excess = max(0.0, load - (n - 1) / n) / max(load, 1e-9)
    return n * per_pod * (excess * 2.0 + 0.1)


def _lower_pays(inp: TunerInput, w: KvWindow, misses: float) -> tuple[bool, str]:
    """A protective lower is worth it when the misses it may fix over the horizon (prudently, half of them)
    exceed LOWER_MARGIN times what the restart costs."""
    load = 1.0 if w.mean_queued >= 1 else _load(inp, w)
    cost = restart_cost_seconds(inp, load)
    benefit = 0.5 * misses * PLANNING_HORIZON_SECONDS
    return benefit > LOWER_MARGIN * cost, f"misses fixed {benefit:.0f}s vs restart {cost:.0f}s of traffic"


def _protect(inp: TunerInput, w: KvWindow, target: int, reason: str, why: str) -> Decision:
    """A protective lower, unless the new limit would still be above every batch the pods ran."""
    if target >= w.peak_active:
        return _hold(inp, "LimitNotBinding", f"{why}; but the batch peaked at {w.peak_active}, below {target}: "
                     f"a lower limit would change nothing (the cause is elsewhere, e.g. long prefills)")
    return _move(inp, target, reason, why, MIN_PROTECTIVE_STEP)


def _kv_fit(w: KvWindow, target_u: float, default: int) -> int:
    """Requests the pool holds at the target utilization, from the blocks one request used (measured within
    one sample, so the peak of utilization and the peak of requests never come from different moments)."""
    per_request = w.blocks_per_request or (w.peak_used_blocks / max(1, w.peak_active))
    return math.floor(target_u * w.max_blocks / per_request) if per_request > 0 else default


def _tpot_bound(inp: TunerInput, w: KvWindow) -> int | None:
    """The largest limit whose predicted p95 TPOT stays within TPOT_HEADROOM of the objective.

    Prediction: the fitted iteration latency at that batch, scaled by how much the observed p95 TPOT
    exceeds the fitted latency at today's batch (prefill interference, tails). None when unknown."""
    slo = inp.spec.slo
    if slo is None or not slo.time_per_output_token_millis:
        return None
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or b <= 0:
        return None
    at_now = a + b * max(1.0, w.mean_generation)
    ratio = max(1.0, (w.tpot_p95_ms or at_now) / at_now)
    budget = TPOT_HEADROOM * slo.time_per_output_token_millis / ratio
    return max(1, math.floor((budget - a) / b))


def _load(inp: TunerInput, w: KvWindow) -> float:
    """How much of a pod's capacity at the current limit its traffic uses (1 = saturated).

    Batch occupancy (requests in flight over the limit) overstates headroom at large limits, where each
    extra request slows every iteration. With the fitted step latency t(c) = a + b*c, decode throughput is
    c / t(c), so the load is (c / t(c)) / (B / t(B))."""
    cur, c = max(1, inp.current), max(0.0, w.mean_active)
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or a <= 0 or b <= 0:
        return min(1.0, c / cur)
    return min(1.0, (c / (a + b * c)) / (cur / (a + b * cur)))


def _capacity_gain(w: KvWindow, cur: int, new: int) -> float:
    """Decode throughput at limit ``new`` over that at ``cur`` (B / t(B)); the limit's own ratio when unfitted."""
    a, b = w.step_ms_intercept, w.step_ms_per_request
    if a is None or b is None or a <= 0 or b <= 0:
        return new / max(1, cur)
    return (new / (a + b * new)) / (cur / (a + b * cur))


def _headroom(inp: TunerInput, w: KvWindow, util: str) -> Decision:
    """Raise before the limit binds, while a restart is clearly free.

    With N pods, a restarting pod's traffic fits on the others while each runs well below (N-1)/N of its
    capacity. Raising then costs nothing; raising later, once requests miss, costs a backlog. The target is
    what the TPOT objective allows by the fitted latency model (or a doubling without one). Load is taken
    conservatively (the larger of batch occupancy and the model's estimate), and a single pod never
    restarts for free, so it waits for real pressure."""
    cur, n = inp.current, max(1, inp.replicas)
    load = max(w.mean_active / max(1, cur), _load(inp, w))
    absorbable = (n - 1) / n
    idle = _hold(inp, "NoPressure", f"Requests are admitted in time; load {load:.0%} of capacity; {util}")
    if not PROACTIVE_RAISES:
        # Do no harm: a limit that does not bind costs nothing, and a restart does. Measured on the suite
        # (docs/tuner-suite.md), raising ahead of need never paid for its restart.
        return idle
    if n < 2 or load < PROACTIVE_MIN_OCCUPANCY or load > PROACTIVE_MAX_LOAD * absorbable:
        return idle
    target_u = inp.spec.target_kv_cache_utilization_percent / 100
    if w.peak_utilization >= target_u - HYSTERESIS or not _tpot_margin(inp, w):
        return idle
    fit = _kv_fit(w, target_u, math.floor(cur * MAX_STEP_FACTOR))
    bound = _tpot_bound(inp, w)
    wanted = min(fit, bound if bound is not None else math.floor(cur * MAX_RAISE_FACTOR),
                 math.floor(cur * MAX_STEP_FACTOR))
    if wanted <= cur or _capacity_gain(w, cur, wanted) < 1 + MIN_RELATIVE_STEP:
        return idle
    how = (f"what the TPOT objective allows ({w.step_ms_per_request:.3f} ms per request per iteration)"
           if bound is not None else "twice the limit")
    return _move(inp, wanted, "Headroom", f"Raising to {how} while load ({load:.0%}) leaves a restart free; {util}")


def decide(inp: TunerInput) -> Decision:
    """The decision for one tuning interval."""
    lo, hi = bounds(inp)
    if inp.build_in_progress or inp.rollout_in_progress:
        return _hold(inp, "RolloutInProgress", "A build or rollout is under way; observing only")
    if inp.current > hi or inp.current < lo:
        clamped = max(lo, min(hi, inp.current))
        action = Action.LOWER if clamped < inp.current else Action.RAISE
        return Decision(action, clamped, "OutOfBounds", f"{inp.current} is outside [{lo}, {hi}]; {inp.current}->{clamped}")
    w = inp.window
    if w is None or w.samples < MIN_SAMPLES or w.max_blocks <= 0:
        return _hold(inp, "InsufficientData", "Not enough warm metrics in the window")
    if inp.expected_pods and w.pods < inp.expected_pods:
        return _hold(inp, "PartialSignals", f"Only {w.pods} of {inp.expected_pods} pods gave warm metrics "
                     f"(warming up or scrapes failing); a partial view is no reason to restart")
    decision = _decide_from_signals(inp, w, lo, hi)
    decision = _no_harm(inp, w, decision)
    if inp.last_applied_at is not None and decision.changes:
        elapsed = (inp.now - inp.last_applied_at).total_seconds()
        # Like an autoscaler's panic window: when most requests still miss after a raise has rolled out,
        # raising again does not wait for the cooldown (which is there to stop flapping, not escalation).
        escalating = decision.action == Action.RAISE and (w.ttft_miss_fraction or 0.0) >= SEVERE_MISSES
        # Protective lowers (paused requests, a broken TPOT objective) do not wait out the cooldown either,
        # only a couple of intervals, so the pods that restarted have been measured.
        protective = decision.action == Action.LOWER and decision.reason in PROTECTIVE_REASONS
        urgent = (escalating or protective) and elapsed >= 2 * inp.spec.interval_seconds
        if elapsed < inp.spec.cooldown_seconds and not urgent:
            return _hold(inp, "Cooldown", f"Last change {elapsed:.0f}s ago (cooldown {inp.spec.cooldown_seconds}s); "
                         f"pending: {decision.action} to {decision.target}")
    # Last, so a hold for any other reason costs no simulation.
    if decision.action in (Action.RAISE, Action.LOWER) and inp.what_if is not None:
        recheck = _what_if_rechecks(inp, w)
        if recheck is not None:
            return _hold(inp, "NoPredictedGain", f"{decision.message}; {recheck}")
        # Each candidate as the guarantees leave it (moved past a value left recently, or dropped), so the
        # simulation can only choose among changes _no_harm allows as they are.
        options = sorted({d.target for c in what_if_candidates(inp.current, decision.target, lo, hi)
                          if (d := _no_harm(inp, w, replace(decision, target=c))).changes and d.target != inp.current})
        load = 1.0 if w.mean_queued >= 1 else _load(inp, w)
        tpot_near = not _tpot_margin(inp, w)
        margin = WHAT_IF_MARGIN * (TPOT_NEAR_MARGIN_FACTOR if decision.action == Action.RAISE and tpot_near else 1.0)
        best, why = what_if_verdict(inp.what_if, w, inp.current, options, restart_cost_seconds(inp, load),
                                    PLANNING_HORIZON_SECONDS, margin, tpot_near)
        if best is None and why != "no traffic fit":
            held = _hold(inp, "NoPredictedGain", f"{decision.message}; but {why}: no candidate beats staying put")
            return replace(held, simulated=True)
        if best is not None:
            checked = _no_harm(inp, w, replace(decision, target=best))
            if not checked.changes or checked.target != best:
                return replace(_hold(inp, checked.reason if not checked.changes else "WouldOscillate",
                                     f"{decision.message}; the simulation chose {best}, which the guarantees "
                                     f"refuse"), simulated=True)
            decision = replace(decision, target=best, message=f"{decision.message}; {why}; chose {best}", simulated=True)
    return decision


def _what_if_rechecks(inp: TunerInput, w: KvWindow) -> str | None:
    """Why the simulation is skipped this interval (None: run it). Once it has declined, it reruns only
    WHAT_IF_RECHECK_SECONDS later, so a pressure that persists without paying costs a simulation every few
    minutes, not every interval; most requests missing reruns it at once."""
    if inp.declined_since is None or (w.ttft_miss_fraction or 0.0) >= SEVERE_MISSES:
        return None
    ago = (inp.now - inp.declined_since).total_seconds()
    if ago >= WHAT_IF_RECHECK_SECONDS:
        return None
    return (f"the simulation declined it {ago:.0f}s ago and reruns {WHAT_IF_RECHECK_SECONDS:.0f}s after that "
            f"unless most requests miss")


def _decide_from_signals(inp: TunerInput, w: KvWindow, lo: int, hi: int) -> Decision:
    target_u = inp.spec.target_kv_cache_utilization_percent / 100
    cur = inp.current
    util = f"KV {w.peak_utilization:.0%} peak (target {target_u:.0%})"

    # Too large: memory (paused requests, pool over target) or latency (TPOT objective broken). Lowering
    # only helps if the new limit binds: below the concurrency that actually occurs.
    # With the what-if, a lower is sized from the batch that really runs (the limit may sit far above it, e.g.
    # after a raise for traffic that has since changed; only a limit below that batch changes anything), and the
    # simulation confirms that fewer concurrent requests fix the objective. Without it, the rules alone do not
    # know whether the batch or something else (long prefills) breaks TPOT: sized from the limit, a lower that
    # would not bind is held (LimitNotBinding).
    running = max(1, min(cur, w.peak_active)) if inp.what_if is not None else cur
    if w.paused > 0:
        return _protect(inp, w, math.floor(running * MAX_LOWER_FACTOR), "RequestsPaused",
                        f"{w.paused} requests were paused for lack of KV blocks; {util}")
    # Under GUARANTEED_NO_EVICT a full pool only delays admission (nothing is paused), so pressure alone
    # is a reason to lower only where the engine evicts.
    if w.peak_utilization > target_u + HYSTERESIS and inp.scheduler_policy == "MaxUtilization":
        scale = max(MAX_LOWER_FACTOR, target_u / w.peak_utilization)
        return _protect(inp, w, math.floor(running * scale), "KvCachePressure", f"{util} is above target")
    broken = _slo_broken(inp, w)
    if broken:
        objective = (inp.spec.slo.time_per_output_token_millis if inp.spec.slo else None) or 1
        # Broken by the share of misses while p95 is within the objective: a mild step (still one that binds).
        scale = min(1.0 - MIN_PROTECTIVE_STEP, max(MAX_LOWER_FACTOR, objective / (w.tpot_p95_ms or 2 * objective)))
        misses = w.tpot_miss_fraction if w.tpot_miss_fraction is not None else 1.0
        worth, verdict = _lower_pays(inp, w, misses)
        if not worth:
            return _hold(inp, "NotWorthARestart", f"{broken}; lowering would cost more than it saves ({verdict})")
        return _protect(inp, w, math.floor(running * scale), "TpotObjectiveBroken", f"{broken}; {verdict}")

    # Too small: requests wait (or miss TTFT) while the batch is full and the pool has room.
    pressure = _pressure(inp, w)
    if pressure is None:
        return _headroom(inp, w, util)
    misses, why = pressure
    full = w.peak_active >= SATURATION * cur
    if full and w.mean_unscheduled >= 1:
        return _hold(inp, "ReservationBound",
                     f"{why}, and {w.mean_unscheduled:.1f} of the {cur} requests in the batch wait for KV blocks on "
                     f"average: admission is bound by reserved blocks (prompt + max_tokens under "
                     f"GUARANTEED_NO_EVICT), so a larger max_batch_size would admit nobody; {util}")
    if not full:
        return _hold(inp, "ReservationBound",
                     f"{why}, but the batch ({w.peak_active}/{cur}) is not full: admission is bound by reserved "
                     f"KV blocks (GUARANTEED_NO_EVICT), not by max_batch_size; {util}")
    if w.peak_utilization >= target_u - HYSTERESIS:
        return _hold(inp, "AtTarget", f"{why}; the batch is full and {util} is at target")
    if not _tpot_margin(inp, w):
        if inp.what_if is None:
            return _hold(inp, "TpotNearObjective", f"{why}; raising would risk the TPOT objective")
        # Requests miss: the what-if simulation (decide()) weighs the TPOT risk of each candidate.
        return _move(inp, math.ceil(cur * MIN_RAISE_FACTOR), "QueueWithHeadroom",
                     f"{why}; the TPOT objective is near, so the simulation decides how far to raise")
    fit = _kv_fit(w, target_u, hi)
    wanted = min(fit, _needed(inp, w, misses), math.floor(cur * MAX_STEP_FACTOR))
    bound = _tpot_bound(inp, w)
    if bound is not None and bound > cur:
        wanted = min(wanted, bound)
    worth, verdict = _worth_a_restart(inp, w, misses, max(wanted, cur + 1))
    if not worth:
        return _hold(inp, "NotWorthARestart", f"{why}; a restart would cost more than it saves ({verdict})")
    if wanted > hi and hi == inp.ceiling and inp.spec.allow_rebuild and inp.ceiling < min(
        inp.spec.max_batch_size, inp.rebuild_limit
    ) and fit >= 1.5 * inp.ceiling:
        ceiling = min(inp.spec.max_batch_size, inp.rebuild_limit, 2 ** math.ceil(math.log2(fit)))
        # The build runs beside the serving pods (its own GPUs), so it costs time, not misses: the gain only
        # starts once it is done, and the new engine still has to roll out.
        worth, verdict = _worth_a_restart(inp, w, misses, min(wanted, ceiling),
                                          PLANNING_HORIZON_SECONDS - inp.build_seconds)
        if not worth:
            return _hold(inp, "RebuildNotWorthIt", f"{why}; the engine's ceiling {inp.ceiling} binds, but a "
                         f"{inp.build_seconds:.0f}s build and a restart would cost more than they save ({verdict})")
        return Decision(Action.REBUILD, cur, "CeilingTooLow",
                        f"{why}; the pool fits about {fit} requests but the engine's ceiling is {inp.ceiling}; "
                        f"{util}; building a ceiling of {ceiling}", ceiling_request=ceiling)
    return _move(inp, wanted, "QueueWithHeadroom", f"{why}; the batch is full ({w.peak_active}/{cur}); {util}; "
                 f"{verdict}")


def _undo_evidence(inp: TunerInput, w: KvWindow, decision: Decision) -> str | None:
    """Why undoing a recent change is warranted (None: it is not): the opposite signal, strongly. A lower past
    where a raise started needs most requests to miss TPOT (paused requests alone say the raise went too far,
    which a lower that stays above where it started fixes); a raise past where a lower started needs many
    TTFT misses with TPOT headroom. Under steady traffic a value cannot fail one way and its neighbour on the
    other side fail the other way, so this lets the tuner follow a phase shift without letting it flap."""
    if decision.action == Action.LOWER:
        if (w.tpot_miss_fraction or 0.0) >= UNDO_MIN_TPOT_MISSES:
            return "most requests now miss the TPOT objective"
        return None
    if (w.ttft_miss_fraction or 0.0) >= REVERSAL_MIN_TTFT_MISSES and _tpot_margin(inp, w):
        return "requests now queue with TPOT headroom"
    return None


def _oscillation(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision:
    """No A->B->A within a planning horizon (see ``_no_harm``): the decision, moved clear of every value A the
    limit left within the horizon, or a hold."""
    horizon = PLANNING_HORIZON_SECONDS
    recent = [c for c in inp.recent_changes if (inp.now - c.at).total_seconds() < horizon]  # newest first
    lower = decision.action == Action.LOWER
    directions = [lower] + [c.to_value < c.from_value for c in recent]
    flips = sum(1 for a, b in zip(directions, directions[1:]) if a != b)
    if len(directions) > 1 and directions[0] != directions[1] and flips > 1:
        return _hold(inp, "WouldOscillate", f"{decision.message}; but the limit changed direction once already "
                     f"less than {horizon:.0f}s ago: at most one reversal per planning horizon")
    band = 1.0 + MIN_RELATIVE_STEP
    lo, hi = bounds(inp)
    undone: dict[int, str] = {}
    # Moving past one value may land near another left earlier: repeat until the target is clear of all of them
    # (each move goes the same way, so this ends).
    for _ in range(len(recent) + 1):
        moved = False
        for change in recent:
            if lower != (change.to_value > change.from_value):
                continue  # the same direction as that change: nothing undone
            a = change.from_value
            if (decision.target < a / band) if lower else (decision.target > a * band):
                pass  # past A by a step worth a restart: an undo, judged below
            elif (decision.target > a * band) if lower else (decision.target < a / band):
                continue  # still on that change's side of A
            held = f"{decision.message}; but the limit left {a} less than {horizon:.0f}s ago"
            why = _undo_evidence(inp, w, decision)
            if why is None:
                return _hold(inp, "WouldOscillate", f"{held}: no A->B->A within a planning horizon")
            undone[a] = why
            if a / band <= decision.target <= a * band:
                # Never back to A itself: past it, by a step worth a restart, or not at all.
                past = math.floor(a / band) if lower else math.ceil(a * band)
                if not lo <= past <= hi or (past >= inp.current if lower else past <= inp.current):
                    return _hold(inp, "WouldOscillate", f"{held}: no A->B->A, and past {a} is out of bounds")
                decision = replace(decision, target=past, message=f"{decision.message}; past {a}, not back to it")
                moved = True
        if not moved:
            break
    for a, why in undone.items():
        decision = replace(decision, message=f"{decision.message}; undoing the change from {a}: {why}")
    return decision


def _no_harm(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision:
    """The guarantees every change must pass, whatever proposed it.

    * no A->B->A within a planning horizon: a change never returns to (within a restart-worthy step of) a value
      the limit left less than a horizon ago; it may go past it only on strong evidence of the opposite kind
      (the traffic changed: ``_undo_evidence``), and at most once per horizon;
    * a lower right after a raise needs stronger evidence than the raise had: paused requests, or a large
      share of TPOT misses (a p95 over the objective alone is not enough);
    * a raise must promise real capacity (the fitted step latency says decode throughput grows by
      MIN_CAPACITY_GAIN at least): when the iteration time grows as fast as the batch, a larger batch only
      makes every token slower.
    """
    if decision.action not in (Action.RAISE, Action.LOWER):
        return decision
    horizon = PLANNING_HORIZON_SECONDS
    decision = _oscillation(inp, w, decision)
    if not decision.changes:
        return decision
    last = inp.recent_changes[0] if inp.recent_changes else None
    if (decision.action == Action.LOWER and last is not None and last.to_value > last.from_value
            and (inp.now - last.at).total_seconds() < horizon):
        strong = w.paused > 0 or (w.tpot_miss_fraction or 0.0) >= REVERSAL_MIN_TPOT_MISSES
        if not strong:
            return _hold(inp, "RecentRaise", f"{decision.message}; a lower right after a raise needs stronger "
                         f"evidence (paused requests or >= {REVERSAL_MIN_TPOT_MISSES:.0%} TPOT misses)")
    if decision.action == Action.RAISE and decision.reason != "OutOfBounds":
        gain = _capacity_gain(w, inp.current, decision.target)
        if gain < MIN_CAPACITY_GAIN:
            return _hold(inp, "NoCapacityGain", f"{decision.message}; but the fitted step latency predicts only "
                         f"x{gain:.2f} decode throughput at {decision.target}: not worth a restart")
    return decision
