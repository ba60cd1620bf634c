"""The rules: what an engineer would do with the window's signals, before any guarantee or simulation.

Too large (paused requests, a pool over target, a broken TPOT objective): lower, if the new limit binds. Too
small (requests wait or miss TTFT beside a full batch with room in the pool): raise by what Little's law and
the pool allow, or ask for a larger engine. Anything else holds. ``decide_from_signals`` is the entry point;
``guarantees.py`` then vets what it proposes.
"""

from __future__ import annotations

import math

from kvpilot.api.status import Action
from kvpilot.autotune.constants import (
    CONSERVATIVE_STEP_FACTOR,
    FREE_SLOTS_HEADROOM,
    LASTING_BREAK_WINDOWS,
    HYSTERESIS,
    MAX_LOWER_FACTOR,
    MAX_STEP_FACTOR,
    MIN_PROTECTIVE_STEP,
    MIN_RAISE_FACTOR,
    MIN_RELATIVE_STEP,
    MIN_WINDOW_REQUESTS,
    PLANNING_HORIZON_SECONDS,
    REVERSAL_MIN_TPOT_MISSES,
    SATURATION,
    TPOT_CONFIRM_SECONDS,
    TPOT_WINDOW_REQUESTS,
)
from kvpilot.autotune.costs import lower_pays, worth_a_restart
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import TunerInput, bounds, hold, move
from kvpilot.autotune.signals import kv_fit, load, needed, pressure, slo_broken, tpot_bound, tpot_margin
from kvpilot.autotune.verify import BASELINE_SECONDS, MAX_SETTLE_SECONDS, MIN_REQUESTS
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.reasons import TunerReason


def protect(inp: TunerInput, w: KvWindow, target: int, reason: TunerReason, why: str) -> Decision:
    """A protective lower, unless the new limit would still be above every batch the pods ran."""
    if target >= w.peak_active:
        return hold(inp, TunerReason.LIMIT_NOT_BINDING, f"{why}; but the batch peaked at {w.peak_active}, below {target}: "
                    f"a lower limit would change nothing (the cause is elsewhere, e.g. long prefills)")
    return move(inp, target, reason, why, MIN_PROTECTIVE_STEP)


def no_pressure(inp: TunerInput, w: KvWindow, util: str) -> Decision:
    """Requests are admitted in time: hold. Do no harm: a limit that does not bind costs nothing, and a restart
    does, so the tuner never raises ahead of need (measured on the suite, docs/tuner-suite.md, such raises
    never paid for their restart)."""
    occupancy = max(w.mean_active / max(1, inp.current), load(inp.current, w))
    return hold(inp, TunerReason.NO_PRESSURE, f"Requests are admitted in time; load {occupancy:.0%} of capacity; {util}")


def decide_from_signals(inp: TunerInput, w: KvWindow, lo: int, hi: int) -> Decision:
    target_u = inp.spec.target_kv_cache_utilization_percent / 100
    util = f"KV {w.peak_utilization:.0%} peak (target {target_u:.0%})"
    too_large = _too_large(inp, w, target_u, util)
    if too_large is not None:
        return too_large
    return _too_small(inp, w, target_u, util, hi)


def _too_large(inp: TunerInput, w: KvWindow, target_u: float, util: str) -> Decision | None:
    """Too large: memory (paused requests, pool over target) or latency (TPOT objective broken). Lowering
    only helps if the new limit binds: below the concurrency that actually occurs. None: not too large.

    With the what-if, a lower is sized from the batch that really runs (the limit may sit far above it, e.g.
    after a raise for traffic that has since changed; only a limit below that batch changes anything), and the
    simulation confirms that fewer concurrent requests fix the objective. Without it, the rules alone do not
    know whether the batch or something else (long prefills) breaks TPOT: sized from the limit, a lower that
    would not bind is held (LimitNotBinding)."""
    cur = inp.current
    running = max(1, min(cur, w.peak_active)) if inp.simulation is not None else cur
    if w.paused > 0:
        return _pool_lower(inp, w, math.floor(running * MAX_LOWER_FACTOR), TunerReason.REQUESTS_PAUSED,
                           f"{w.paused} requests were paused for lack of KV blocks; {util}")
    # Under GUARANTEED_NO_EVICT a full pool only delays admission (nothing is paused), so pressure alone
    # is a reason to lower only where the engine evicts.
    if w.peak_utilization > target_u + HYSTERESIS and inp.scheduler_policy == "MaxUtilization":
        scale = max(MAX_LOWER_FACTOR, target_u / w.peak_utilization)
        return _pool_lower(inp, w, math.floor(running * scale), TunerReason.KV_CACHE_PRESSURE,
                           f"{util} is above target")
    broken = slo_broken(inp.spec.slo, w)
    if broken:
        objective = (inp.spec.slo.time_per_output_token_millis if inp.spec.slo else None) or 1
        # Broken by the share of misses while p95 is within the objective: a mild step (still one that binds).
        scale = min(1.0 - MIN_PROTECTIVE_STEP, max(MAX_LOWER_FACTOR, objective / (w.tpot_p95_ms or 2 * objective)))
        misses = w.tpot_miss_fraction if w.tpot_miss_fraction is not None else 1.0
        lasting = _lasting_misses(inp, w, misses, broken)
        if isinstance(lasting, Decision):
            return lasting
        worth, verdict = lower_pays(inp.cost, cur, w, lasting[0], inp.spec.slo)
        verdict += lasting[1]
        if not worth:
            return hold(inp, TunerReason.NOT_WORTH_A_RESTART, f"{broken}; lowering would cost more than it saves ({verdict})")
        target = math.floor(running * scale)
        bound = tpot_bound(inp.spec.slo, w)
        if misses >= REVERSAL_MIN_TPOT_MISSES and bound is not None and 1 < bound < target:
            # Many misses: the p95's ratio sizes too mild a step near a cliff (each request fewer also shortens
            # every other's step); the fitted step latency says where TPOT is met again. A bound of 1 says the
            # fit meets the objective at no batch (its intercept alone, scaled by today's tails, is over it): it
            # sizes nothing, and the p95's ratio stands.
            target = max(math.floor(running * MAX_LOWER_FACTOR), bound)
            verdict = f"{verdict}; the fitted step latency meets the objective at {bound}"
        return protect(inp, w, target, TunerReason.TPOT_OBJECTIVE_BROKEN, f"{broken}; {verdict}")
    return None


def _pool_lower(inp: TunerInput, w: KvWindow, target: int, reason: TunerReason, why: str) -> Decision:
    """A lower for the KV pool (requests paused, a MaxUtilization pool over target), made once the misses it may
    fix pay for its restart (``costs.lower_pays``, as for a TPOT break). A pool that pauses requests, or runs past
    target, and costs none of them its objectives is a forecast, not harm: under MaxUtilization a paused request
    is resumed, and only its latency says what the pause cost. Where there is no evidence yet (``_pool_evidence``)
    the tuner waits a window; without objectives to weigh, or on pods that export no latency, the pool's signal
    decides as before.

    Measured on the suite's KV-scarce L4 under MaxUtilization without a spare GPU (docs/tuner-suite.md,
    "Eighteenth pass"): every static limit serves that traffic within 1%, and from TensorRT-LLM's default each
    lower the pool called for cost its restart: a 92% peak at 720 s lowered 2048 -> 8 and served 0.403 req/s
    where 2048 held serves 0.415; on the engine decoding 30% off its profile the lower served 0.376 against 0.386."""
    slo = inp.spec.slo
    if slo is None or not (slo.time_to_first_token_millis or slo.time_per_output_token_millis):
        return protect(inp, w, target, reason, why)
    evidence = _pool_evidence(inp, w)
    if evidence is None:
        if w.ttft_miss_fraction is None and w.tpot_miss_fraction is None and w.completion_rate > 0:
            return protect(inp, w, target, reason, why)  # requests finish, yet no latency: the pods export none
        if w.paused > 0 and w.completion_rate <= 0 and w.mean_queued >= 1:
            return protect(inp, w, target, reason, f"{why}; nothing finished while requests queued")  # a stall
        return hold(inp, TunerReason.KV_PRESSURE_UNCONFIRMED, f"{why}; {_finished(w):.0f} requests finished in "
                    f"this window, too few to say what the pool costs them, and no settled minutes at "
                    f"{inp.current} yet: waiting")
    misses, note = evidence
    worth, verdict = lower_pays(inp.cost, inp.current, w, misses, slo)
    if not worth:
        return hold(inp, TunerReason.NOT_WORTH_A_RESTART,
                    f"{why}; lowering would cost more than it saves ({verdict}{note})")
    return protect(inp, w, target, reason, f"{why}; {verdict}{note}")


def _finished(w: KvWindow) -> float:
    """Requests the fleet finished in the window."""
    return w.completion_rate * w.window_seconds * w.pods


def _few(finished: float, bar: float = MIN_WINDOW_REQUESTS) -> bool:
    """A window that finished requests, fewer than ``bar`` (MIN_WINDOW_REQUESTS; a TPOT break's share alone needs
    TPOT_WINDOW_REQUESTS). 0 reads as not counted (a window built from latency histograms alone): live, a TPOT
    share needs finished requests, so a TPOT break never comes from a window that finished none. The pool's
    evidence (``_pool_evidence``) counts 0 as too few: a TTFT share can come from first tokens alone. The count is
    the fleet's, and the live share the worst pod's (summarize.py), so live the share rests on about ``bar`` / N
    requests on a fleet of N pods."""
    return 0 < finished < bar


def _pool_evidence(inp: TunerInput, w: KvWindow) -> tuple[float, str] | None:
    """The share of requests that missed an objective, to weigh a pool lower on, with a note for the message: the
    window's own (``weighed_misses``) once it finished MIN_WINDOW_REQUESTS (none finished counts as too few here),
    else the settled minutes' at this limit (``_sparse_pool``); None while neither exists. A share of a handful of
    requests is noise: at 0.4 req/s a 15 s window finishes about six, and one that missed them all lowered the L4
    of the docstring above at 1,410 s (0.358 req/s against 0.386 held)."""
    finished = _finished(w)
    if (w.ttft_miss_fraction is not None or w.tpot_miss_fraction is not None) and finished >= MIN_WINDOW_REQUESTS:
        return weighed_misses(inp, w.miss_share, finished)
    return _sparse_pool(inp, finished)


def _sparse_pool(inp: TunerInput, finished: float) -> tuple[float, str] | None:
    """For a window of too few requests: the settled minutes' share at this limit (``settled_misses``, sparse),
    with a note for the message; None while they do not exist."""
    settled = settled_misses(inp, sparse=True)
    if settled is None:
        return None
    return settled[0], (f"; {finished:.0f} requests finished in this window, {settled[0]:.1%} missed over the last "
                        f"{settled[1]:.0f}s at {inp.current}")


def weighed_misses(inp: TunerInput, misses: float, finished: float,
                   alone: float = MIN_WINDOW_REQUESTS) -> tuple[float, str]:
    """The share of requests a lower may fix over the horizon, with a note for the message: the share pooled over
    the settled minutes at this limit (``settled_misses``), or this window's own where no such evidence exists
    yet or where the misses last (LASTING_BREAK_WINDOWS settled windows in a row missed REVERSAL_MIN_TPOT_MISSES
    or more: a cliff, not a swell; ``_lasting_misses`` says why) in a window of ``alone`` requests or more
    (``finished``: at a handful of requests a window misses a fifth by chance, and so do three in a row)."""
    base = inp.history.verification.baseline
    lasting = (misses >= REVERSAL_MIN_TPOT_MISSES and base.missing_streak >= LASTING_BREAK_WINDOWS
               and not _few(finished, alone))
    settled = settled_misses(inp)
    if settled is None or lasting:
        return misses, ""
    pooled, seconds = settled
    return pooled, (f"; {misses:.0%} of this window's requests missed, {pooled:.1%} over the last "
                    f"{seconds:.0f}s at {inp.current}")


def _lasting_misses(inp: TunerInput, w: KvWindow, misses: float, broken: str) -> tuple[float, str] | Decision:
    """The share of requests a protective lower for a TPOT break may fix over the horizon, with a note for the
    message; or a hold while that cannot be told yet.

    One window is one sample of a share that scatters from window to window: under steady traffic a pod's batch
    swells and drains by chance, and a 15 s window in a swell misses several times what the traffic misses on
    average. Measured on the suite
    (rag-then-chat-a100, served with prefill 30% slower; docs/tuner-suite.md): at 2048 the document phase missed
    1.4% of its requests, while single windows missed 5-11% with p95 TPOT up to 78 ms against 60 ms; each such
    window called for a lower that fixed nothing (7,077 good requests in the phase at 40 against 7,097 at 2048)
    and left the engine at 40 when chat traffic arrived. So a break is weighed on the share verification's
    baseline pools over the settled, comparable windows at this limit (autotune/verification.Baseline, this one
    included when it is clean, about the last two to four minutes), once it holds TPOT_CONFIRM_SECONDS of them. That holds for a
    window with many misses too: on the suite's overloaded case with a 22 ms TPOT objective, at 2048 without a
    spare GPU, one window missed 62% where static 2048 serves 95% of the requests in time, and the lower it called
    for cost 8% of the run's goodput (static 2048 serves 1.5% less than the best limit). A break that lasts is told
    from a swell by its length: once LASTING_BREAK_WINDOWS settled windows in a row at this limit missed
    REVERSAL_MIN_TPOT_MISSES or more (verification.Baseline.missing_streak), a window with that many misses is taken
    at its own share, if it finished TPOT_WINDOW_REQUESTS; a load that moved restarts the pool, and the window then
    decides at once too. The pool counts the misses of either objective, the window TPOT's alone.

    Without that evidence: a window with many misses (REVERSAL_MIN_TPOT_MISSES or more) decides at once; a milder
    one waits while the batch at this limit is still settling (a cold start, a change just rolled), and where no
    settled evidence can come (the load keeps moving, windows are never clean) the window's own share decides.
    Either way only once the window holds TPOT_WINDOW_REQUESTS, the requests verification holds a share to; fewer,
    and the sparse pool decides or the break waits. A share of a few requests is a burst's: at 0.42 req/s, on the
    suite's KV-scarce L4 decoding 30% off its profile, a window where 3 of 6 requests missed lowered 64 -> 8 at
    1,245 s (docs/tuner-suite.md, "Eighteenth pass"), and with a bar of 10 a burst window where 7 of 10 missed
    still did at 1,365 s, its 70% past SEVERE_MISSES and so unpriced, where the run's requests missed 13%: 8 serves
    6% more than 64 held, but its restart without surge does not pay back within 90 minutes ("Twenty-seventh
    pass"; "Twenty-eighth pass" for the bar of 40)."""
    finished = _finished(w)
    if settled_misses(inp) is not None:
        return weighed_misses(inp, misses, finished, TPOT_WINDOW_REQUESTS)
    if _few(finished, TPOT_WINDOW_REQUESTS):
        pooled = _sparse_pool(inp, finished)
        if pooled is not None:
            return pooled
        return hold(inp, TunerReason.TPOT_BREAK_UNCONFIRMED,
                    f"{broken}, with {misses:.0%} of this window's requests missing it; {finished:.0f} requests "
                    f"finished in it, too few to tell, and no settled minutes at {inp.current} yet: waiting")
    if misses < REVERSAL_MIN_TPOT_MISSES and young_batch(inp):
        base = inp.history.verification.baseline
        return hold(inp, TunerReason.TPOT_BREAK_UNCONFIRMED,
                    f"{broken}, with {misses:.0%} of this window's requests missing it; the batch at {inp.current} "
                    f"has {base.side.seconds:.0f}s of settled traffic (a lasting break is told from a transient on "
                    f"{TPOT_CONFIRM_SECONDS:.0f}s): waiting")
    return misses, ""


def young_batch(inp: TunerInput) -> bool:
    """The batch at the limit in force is still settling: verification's baseline is at this limit and it came
    into force under MAX_SETTLE_SECONDS + TPOT_CONFIRM_SECONDS ago, too soon to tell a lasting TPOT break from a
    transient on one window (``_lasting_misses``, ``judged.unsettled_break``)."""
    base = inp.history.verification.baseline
    start = base.settle.in_force_s
    return (base.limit == inp.current and start is not None
            and inp.now.timestamp() - start < MAX_SETTLE_SECONDS + TPOT_CONFIRM_SECONDS)


def settled_misses(inp: TunerInput, sparse: bool = False) -> tuple[float, float] | None:
    """(share of requests that missed an objective, seconds) over the settled, comparable windows at the limit in
    force (verification's baseline), once they hold TPOT_CONFIRM_SECONDS and MIN_REQUESTS; None before.

    ``sparse``: for windows that finish too few to weigh alone (``_few``), the pool needs only what it can hold
    at the traffic's rate, two minutes of it (between MIN_WINDOW_REQUESTS and MIN_REQUESTS): it fades past four
    minutes, so below about 0.16 req/s it would never hold MIN_REQUESTS, and a hold waiting for them would never
    end. At 0.4 req/s the bar stays MIN_REQUESTS: on the suite's L4 slower in everything, from 2048, a pool of 60 s
    of 10 requests or more lowered at 1,305 s, too late to pay back (0.347 req/s against 0.358 without it)."""
    base = inp.history.verification.baseline
    side = base.side
    needed = float(MIN_REQUESTS)
    if sparse and side.seconds > 0:
        needed = min(needed, max(float(MIN_WINDOW_REQUESTS), side.resolved / side.seconds * BASELINE_SECONDS))
    if base.limit != inp.current or side.seconds < TPOT_CONFIRM_SECONDS or side.resolved < needed:
        return None
    return 1.0 - side.share, side.seconds


def settled_split(inp: TunerInput, w: KvWindow) -> tuple[float, float] | None:
    """(TPOT misses, TTFT misses) as shares over the same settled minutes as ``settled_misses``, once MIN_REQUESTS
    of them have their split known, while this window's batch fills the limit (its peak at SATURATION of it); None
    otherwise. Only a full batch trades: a lower admits fewer only where the limit bounds admission. Measured on
    long outputs served by PyTorch with a spare GPU (long-output-a100 from 2048): the batch peaked at ~420, 15-16%
    of the requests missed TTFT beside 3-6% missing TPOT over the settled minutes, and the lower to ~374 that the
    split would have handed to the model served 1.9-3.0% more than holding 2048 on each of the four engines."""
    if settled_misses(inp) is None or w.peak_active < SATURATION * inp.current:
        return None
    return inp.history.verification.baseline.side.split_shares(MIN_REQUESTS)


def _too_small(inp: TunerInput, w: KvWindow, target_u: float, util: str, hi: int) -> Decision:
    """Too small: requests wait (or miss TTFT) while the batch is full and the pool has room."""
    cur = inp.current
    found = pressure(inp.spec.slo, cur, w)
    if found is None:
        return no_pressure(inp, w, util)
    misses, why = found
    full = w.peak_active >= SATURATION * cur
    if full and w.mean_unscheduled >= 1:
        return hold(inp, TunerReason.RESERVATION_BOUND,
                    f"{why}, and {w.mean_unscheduled:.1f} of the {cur} requests in the batch wait for KV blocks on "
                    f"average: admission is bound by reserved blocks (prompt + max_tokens under "
                    f"GUARANTEED_NO_EVICT), so a larger max_batch_size would admit nobody; {util}")
    if not full:
        reserved = (f"{why}, but the batch ({w.peak_active}/{cur}) is not full: admission is bound by reserved "
                    f"KV blocks (GUARANTEED_NO_EVICT), not by max_batch_size; {util}")
        return _free_slots(inp, w, reserved) or hold(inp, TunerReason.RESERVATION_BOUND, reserved)
    if w.peak_utilization >= target_u - HYSTERESIS:
        return hold(inp, TunerReason.AT_TARGET, f"{why}; the batch is full and {util} is at target")
    if not tpot_margin(inp.spec.slo, w):
        if inp.simulation is None:
            return hold(inp, TunerReason.TPOT_NEAR_OBJECTIVE, f"{why}; raising would risk the TPOT objective")
        # Requests miss: the what-if simulation (decide()) weighs the TPOT risk of each candidate.
        return move(inp, math.ceil(cur * MIN_RAISE_FACTOR), TunerReason.QUEUE_WITH_HEADROOM,
                    f"{why}; the TPOT objective is near, so the simulation decides how far to raise")
    fit = kv_fit(w, target_u, hi)
    step = CONSERVATIVE_STEP_FACTOR if inp.what_if.measured_only else MAX_STEP_FACTOR
    wanted = min(fit, needed(cur, w, misses), math.floor(cur * step))
    bound = tpot_bound(inp.spec.slo, w)
    if bound is not None and bound > cur:
        wanted = min(wanted, bound)
    worth, verdict = worth_a_restart(inp.cost, cur, w, misses, max(wanted, cur + 1))
    if not worth:
        return hold(inp, TunerReason.NOT_WORTH_A_RESTART, f"{why}; a restart would cost more than it saves ({verdict})")
    if wanted > hi and _may_rebuild(inp, hi, fit):
        return _rebuild(inp, w, misses, wanted, fit, why, util)
    careful = "; the model disagrees with the pods, so the step is at most x1.5" if inp.what_if.measured_only else ""
    return move(inp, wanted, TunerReason.QUEUE_WITH_HEADROOM, f"{why}; the batch is full ({w.peak_active}/{cur}); {util}; "
                f"{verdict}{careful}")


def _free_slots(inp: TunerInput, w: KvWindow, why: str) -> Decision | None:
    """A lower that gives unused batch slots' memory back to the KV pool, for the what-if to judge; None when
    there is no simulation to judge it or no real step to take.

    Every slot up to the RUNTIME max_batch_size holds runtime and decoder buffers sized by max_seq_len, used or
    not, and the pool gets what is left after them (kvsim/memory.py, from TensorRT-LLM's RuntimeBuffers and
    DecoderState; the PyTorch backend's CUDA graphs likewise follow max_batch_size). So where requests miss TTFT
    because admission waits on KV blocks (GUARANTEED_NO_EVICT reserves them) while the batch runs far below the
    limit, the limit that does not bind still costs blocks, and a lower to FREE_SLOTS_HEADROOM times the batch
    returns them. How many requests that admits depends on the buffers' size, which only the what-if's memory plan
    knows: the change is not protective, so the simulation may veto it. Measured on the suite: from TensorRT-LLM's
    default 2048, an L40S decoding 30% off its profile ran ~290 requests and let a fifth of them miss TTFT, where
    512 served 13% more."""
    if inp.simulation is None or inp.scheduler_policy != "GuaranteedNoEvict" or w.peak_active <= 0:
        return None
    target = max(bounds(inp)[0], math.ceil(w.peak_active * FREE_SLOTS_HEADROOM))
    if target > (1.0 - MIN_RELATIVE_STEP) * inp.current:
        return None
    return move(inp, target, TunerReason.RESERVATION_BOUND,
                f"{why}; each unused slot up to {inp.current} holds buffers the pool could use, so the simulation "
                f"weighs lowers down to the batch that runs")


def _may_rebuild(inp: TunerInput, hi: int, fit: int) -> bool:
    """The engine's ceiling binds, a rebuild may lift it, and the pool fits well past it."""
    return (hi == inp.ceiling and inp.spec.allow_rebuild
            and inp.ceiling < min(inp.spec.max_batch_size, inp.rebuild_limit) and fit >= 1.5 * inp.ceiling)


def _rebuild(inp: TunerInput, w: KvWindow, misses: float, wanted: int, fit: int, why: str, util: str) -> Decision:
    ceiling = min(inp.spec.max_batch_size, inp.rebuild_limit, 2 ** math.ceil(math.log2(fit)))
    # The build runs beside the serving pods (its own GPUs), so it costs time, not misses: the gain only
    # starts once it is done, and the new engine still has to roll out.
    build_seconds = inp.cost.build_seconds
    worth, verdict = worth_a_restart(inp.cost, inp.current, w, misses, min(wanted, ceiling),
                                     PLANNING_HORIZON_SECONDS - build_seconds)
    if not worth:
        return hold(inp, TunerReason.REBUILD_NOT_WORTH_IT, f"{why}; the engine's ceiling {inp.ceiling} binds, but a "
                    f"{build_seconds:.0f}s build and a restart would cost more than they save ({verdict})")
    return Decision(Action.REBUILD, inp.current, TunerReason.CEILING_TOO_LOW,
                    f"{why}; the pool fits about {fit} requests but the engine's ceiling is {inp.ceiling}; "
                    f"{util}; building a ceiling of {ceiling}", ceiling_request=ceiling)
