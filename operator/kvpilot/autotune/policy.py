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

``decide`` runs, in order: the preconditions (nothing rolling, the value within bounds, a full window), the
rules (``rules.py``, reading ``signals.py`` and pricing with ``costs.py``), the guarantees (``guarantees.py``:
no A->B->A, no lower right after a raise on weak evidence, no raise without capacity), the cooldown, and last
the what-if simulation (``whatif.py``) where the gate (``gate.py``) lets it run, or the gate's hold when the
engine's simulation budget is spent. Its input is in ``inputs.py``, its output in ``decision.py``, its reasons in
``reasons.py`` and its thresholds in ``constants.py``.
"""

from __future__ import annotations

from dataclasses import replace

from kvpilot.api.models import SloSpec
from kvpilot.api.status import Action
from kvpilot.autotune.constants import (
    MIN_SAMPLES,
    PLANNING_HORIZON_SECONDS,
    REVERSAL_MIN_TTFT_MISSES,
    SEVERE_MISSES,
    TPOT_NEAR_MARGIN_FACTOR,
)
from kvpilot.autotune.costs import restart_cost_seconds
from kvpilot.autotune.ahead import traffic_ahead
from kvpilot.autotune.judged import model_judges, over_read, over_read_gain, unsettled_break, waits_for_settling
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import TunerInput, bounds, hold
from kvpilot.autotune.pooling import replayed
from kvpilot.autotune.guarantees import no_harm
from kvpilot.autotune.verify import MIN_EVIDENCE_SECONDS
from kvpilot.autotune.rollback import load_moved, rolled_back, verified_first, within_bars
from kvpilot.autotune.rules import decide_from_signals, settled_misses, settled_split
from kvpilot.autotune.shift import mix_wait
from kvpilot.autotune.signals import restart_load, tpot_margin, tpot_trade_off
from kvpilot.autotune.censored import output_factor, uncensored
from kvpilot.autotune.replay import fit_traffic
from kvpilot.autotune.ladder import candidates as what_if_candidates
from kvpilot.autotune.whatif import MARGIN as WHAT_IF_MARGIN
from kvpilot.autotune.whatif import Decline
from kvpilot.autotune.whatif import Engine as WhatIfEngine
from kvpilot.autotune.whatif import verdict as what_if_verdict
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.reasons import PROTECTIVE_REASONS, TunerReason


def decide(inp: TunerInput) -> Decision:
    """The decision for one tuning interval."""
    lo, hi = bounds(inp)
    w = _observable(inp, lo, hi)
    if isinstance(w, Decision):
        return w
    back = rolled_back(inp)  # measured worse: undone at once, before any rule, guarantee or simulation
    if back is not None:
        return back
    decision = verified_first(inp, w, _clear_of_bars(inp, w, no_harm(inp, w, decide_from_signals(inp, w, lo, hi))))
    waiting = _cooldown(inp, w, decision)
    if waiting is not None:
        return waiting
    # Last, so a hold for any other reason costs no simulation.
    model = inp.simulation
    # A rollback goes back to the value measured to serve well: no model resizes it.
    if decision.action in (Action.RAISE, Action.LOWER) and model is not None and decision.reason != TunerReason.ROLLED_BACK:
        return _settled(inp, w, decision) or _simulated(inp, w, decision, model, lo, hi)
    return inp.what_if.withheld(decision, inp.current, _called_for(inp, decision, w))


def _clear_of_bars(inp: TunerInput, w: KvWindow, vetted: Decision) -> Decision:
    """``vetted`` (guarantees passed) kept clear of verification's bars. A target the bars moved is vetted again
    (moved inside a bar, it may land back near a value the limit recently left); if the guarantees then move it
    into the bar again, or hold, nothing is changed."""
    barred = within_bars(inp, vetted)
    if not barred.changes or barred.target == vetted.target:
        return barred
    again = no_harm(inp, w, barred)
    if again.changes and again.target == barred.target:
        return barred
    return hold(inp, TunerReason.BARRED_BY_VERIFICATION, f"{barred.message}; but {again.message.rsplit('; ', 1)[-1]}")


def _observable(inp: TunerInput, lo: int, hi: int) -> KvWindow | Decision:
    """The window to decide from, or the decision that needs none: a hold while a build or rollout runs or the
    window is thin or partial, a clamp at once when the value in force is outside the bounds."""
    if inp.build_in_progress or inp.rollout_in_progress:
        return hold(inp, TunerReason.ROLLOUT_IN_PROGRESS, "A build or rollout is under way; observing only")
    if inp.current > hi or inp.current < lo:
        clamped = max(lo, min(hi, inp.current))
        action = Action.LOWER if clamped < inp.current else Action.RAISE
        return Decision(action, clamped, TunerReason.OUT_OF_BOUNDS,
                        f"{inp.current} is outside [{lo}, {hi}]; {inp.current}->{clamped}")
    w = inp.window
    if w is None or w.samples < MIN_SAMPLES or w.max_blocks <= 0:
        return hold(inp, TunerReason.INSUFFICIENT_DATA, "Not enough warm metrics in the window")
    if inp.expected_pods and w.pods < inp.expected_pods:
        return hold(inp, TunerReason.PARTIAL_SIGNALS, f"Only {w.pods} of {inp.expected_pods} pods gave warm metrics "
                    f"(warming up or scrapes failing); a partial view is no reason to restart")
    return w


def _cooldown(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision | None:
    """A hold while the last change is younger than the cooldown (None: the change may go ahead)."""
    last_applied_at = inp.history.last_applied_at
    if last_applied_at is None or not decision.changes:
        return None
    elapsed = (inp.now - last_applied_at).total_seconds()
    # Like an autoscaler's panic window: when most requests still miss after a raise has rolled out,
    # raising again does not wait for the cooldown (which is there to stop flapping, not escalation).
    escalating = decision.action == Action.RAISE and (w.ttft_miss_fraction or 0.0) >= SEVERE_MISSES
    # Protective lowers (paused requests, a broken TPOT objective) do not wait out the cooldown either,
    # only a couple of intervals, so the pods that restarted have been measured.
    protective = decision.action == Action.LOWER and _called_for(inp, decision, w)
    urgent = (escalating or protective or _followed(inp, w, decision) or _verified_step(inp, w, decision)) \
        and elapsed >= 2 * inp.spec.interval_seconds
    if elapsed < inp.spec.cooldown_seconds and not urgent:
        return hold(inp, TunerReason.COOLDOWN, f"Last change {elapsed:.0f}s ago (cooldown {inp.spec.cooldown_seconds}s); "
                    f"pending: {decision.action} to {decision.target}")
    return None


def _followed(inp: TunerInput, w: KvWindow, decision: Decision) -> bool:
    """A raise for queueing requests after the traffic changed since the last change (a phase shift): the
    cooldown stops flapping at one load, and says nothing of another. Measured on the suite's document Q&A then
    chat case: a lower for the Q&A phase 5 minutes before chat arrived held the limit at 44 for another 5
    minutes of chat traffic at 30 req/s, a third of its requests missing TTFT."""
    if decision.action != Action.RAISE or (w.ttft_miss_fraction or 0.0) < REVERSAL_MIN_TTFT_MISSES:
        return False
    return load_moved(inp, w, inp.history.verification.change_load)


def _verified_step(inp: TunerInput, w: KvWindow, decision: Decision) -> bool:
    """A raise for requests that still miss TTFT (REVERSAL_MIN_TTFT_MISSES or more, in the window and pooled over
    verification's settled baseline at the value in force) after the last change, a raise to that value, has been
    measured (nothing pending, a minute of settled evidence) and not rolled back: the next step up is no reversal,
    and the cooldown is there to stop flapping, not a climb whose every step was measured. Measured on the suite: from 64 on an A100
    decoding 30% off its profile, a first raise to 117 served 28-31% of requests late for the whole 10-minute
    cooldown before the raise to 234 (long-output-a100.decode0.7)."""
    if decision.action != Action.RAISE or (w.ttft_miss_fraction or 0.0) < REVERSAL_MIN_TTFT_MISSES:
        return False
    recent = inp.history.recent_changes
    if not recent or recent[0].to_value != inp.current or recent[0].to_value <= recent[0].from_value:
        return False
    memory = inp.history.verification
    base = memory.baseline
    return (memory.pending(inp.now.timestamp()) is None and base.limit == inp.current
            and base.side.seconds >= MIN_EVIDENCE_SECONDS and 1.0 - base.side.share >= REVERSAL_MIN_TTFT_MISSES)


def called_for(decision: Decision, w: KvWindow, slo: SloSpec | None,
               settled: tuple[float, float] | None = None) -> bool:
    """A protective change the measurements call for (paused requests, KV pressure, a broken TPOT objective),
    which neither the what-if nor the cooldown may hold back. Not a TPOT break that trades against TTFT misses
    in the window or over the ``settled`` minutes (``signals.tpot_trade_off``): lowering there fixes some misses
    by causing others, and the what-if judges it."""
    if decision.reason == TunerReason.ROLLED_BACK:
        return True  # a severe TPOT break undoing the raise that caused it (guarantees.oscillation)
    if decision.reason not in PROTECTIVE_REASONS:
        return False
    return decision.reason != TunerReason.TPOT_OBJECTIVE_BROKEN or not tpot_trade_off(slo, w, settled)


def _called_for(inp: TunerInput, decision: Decision, w: KvWindow) -> bool:
    """``called_for`` with the settled minutes at the limit in force (``rules.settled_split``)."""
    return called_for(decision, w, inp.spec.slo, settled_split(inp, w))


def _settled(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision | None:
    """A hold while the traffic's mix is shifting (autotune/shift.py) and the change is no protective one, or a
    TPOT break no settled minutes weigh yet (``_break_in_transit``): the what-if would size it on lengths that
    still mix the old traffic's. None: the what-if may size it now (or would not run: no traffic fit)."""
    protective = _called_for(inp, decision, w)
    if (protective and not _break_in_transit(inp, w, decision)) or fit_traffic(w) is None:
        return None
    since = inp.history.shifting_since
    holding_for = (inp.now - since).total_seconds() if since is not None else None
    moving = mix_wait(inp.history.last_traffic, w, holding_for, inp.spec.interval_seconds)
    if moving is None:
        return None
    waiting = hold(inp, TunerReason.TRAFFIC_SHIFTING, f"{decision.message}; waiting a window: {moving}")
    return replace(waiting, keeps_traffic=protective)


def _break_in_transit(inp: TunerInput, w: KvWindow, decision: Decision) -> bool:
    """A TPOT-break lower decided on one window's own share (no settled minutes at this limit weigh it yet), which
    waits while the mix shifts, as a change for a gain does (at most ``shift.MAX_SHIFT_WINDOWS`` intervals, one
    while most requests miss). Such a window measures the old traffic's batch meeting the new traffic's prompts,
    not this limit on the traffic ahead. Measured on chat then document Q&A served 20% faster than its profile
    (chat-then-rag-a100.all-fast from 2048, PyTorch, no spare GPU; docs/tuner-suite.md "Twenty-sixth pass"): the
    windows whose requests arrived at 885-930 s, as the documents' 2,000-token prompts joined some 370 chat
    requests in flight, missed TPOT for 34%, 73%, 36% and 14% of their requests, and every later window of the
    phase at 2048 for 0-12%; the lower the window at 930 s called for (49% missing) cost a rolling restart
    without surge and ended the run at 0.964x static 2048. Paused requests and KV pressure never wait, nor does
    a break the settled minutes weigh (the baseline restarts at a new mix, so it is the new traffic's), nor one in
    pods still filling since they started (``censored.output_factor`` above 1): their lengths move as the short
    requests finish first, not as the mix shifts. Measured on document Q&A from 2048 on the TensorRT backend
    without a spare GPU (rag-then-chat-a100.overhead0.7): the cold start's lower waited at 60 s, went to 62 at
    75 s and needed a second to 36, and the run ended at 0.950x static 2048 where the lower at 60 s gave 0.983x."""
    return (decision.reason == TunerReason.TPOT_OBJECTIVE_BROKEN and settled_misses(inp) is None
            and output_factor(w.finished_total, w.in_pods) == 1.0)


def _options(inp: TunerInput, w: KvWindow, decision: Decision, lo: int, hi: int, deeper: bool = False) -> list[int]:
    """The candidates the simulation may choose from, each as the guarantees leave it (moved past a value left
    recently, or dropped), so it can only choose among changes no_harm allows as they are.

    no_harm is idempotent on what it lets through (a target it moved is clear of every value it guards, and
    its other checks do not depend on the target), so an option needs no second check once chosen, and the
    rules' own target (``decision``, vetted already) none at all."""
    options = {decision.target}
    for c in what_if_candidates(inp.current, decision.target, lo, hi, deeper):
        if c == decision.target:
            continue
        d = within_bars(inp, no_harm(inp, w, replace(decision, target=c)))
        if d.changes and d.target != inp.current:
            options.add(d.target)
    return sorted(options)


def _simulated(inp: TunerInput, w: KvWindow, decision: Decision, model: WhatIfEngine, lo: int, hi: int) -> Decision:
    """The rules' change as the what-if simulation confirms (or resizes) it, or a hold when no candidate
    beats staying put. A protective change the measurements call for (paused requests, KV pressure, a broken
    TPOT objective) the simulation may resize among its candidates but never veto (issue 18: on an engine
    slower than its model, the model saw no gain in lowering from a TPOT cliff, and held there for 28 minutes);
    a mild break that the model over-reads waits (``judged.over_read``), and so does a young batch's break read on
    one window where the model clearly prefers staying put (``judged.waits_for_settling``). A TPOT lower only the
    model asks for is declined where it over-reads the limit in force (``judged.over_read_gain``)."""
    protective = _called_for(inp, decision, w)
    traffic = replayed(inp.history.last_traffic, w)  # the window with the pooled traffic (autotune/pooling.py)
    if protective:
        traffic, young = uncensored(traffic, w)
        decision = replace(decision, message=f"{decision.message}; {young}") if young else decision
    over = over_read(inp, traffic, decision, model) if protective else None
    if over is not None:
        return hold(inp, TunerReason.TPOT_BREAK_UNCONFIRMED, f"{decision.message}; {over}")
    judged = model_judges(inp, traffic, decision, model) if protective else None
    if judged is not None:
        protective = False
        decision = replace(decision, message=f"{decision.message}; {judged}")
    # A young batch's break read on one window may wait for its settled minutes where the model, run afresh, holds
    # staying put clearly best (``judged.unsettled_break``, ``judged.waits_for_settling``).
    unsettled = unsettled_break(inp, w, decision) if protective else None
    recheck = inp.what_if.recheck(inp.history.declined_since, inp.now, w) if unsettled is None else None
    if recheck is not None:
        if protective:
            return replace(decision, message=f"{decision.message}; the simulation, which declined it recently, "
                           f"cannot veto a change the measurements call for")
        return hold(inp, TunerReason.NO_PREDICTED_GAIN, f"{decision.message}; {recheck}")
    ahead = traffic_ahead(model, inp.history.last_traffic, w, traffic, inp.current) \
        if protective and decision.reason == TunerReason.TPOT_OBJECTIVE_BROKEN else None
    if ahead is not None:
        traffic = ahead[0]
        decision = replace(decision, message=f"{decision.message}; {ahead[1]}")
    load = restart_load(inp.spec.slo, inp.current, w)
    tpot_near = not tpot_margin(inp.spec.slo, w)
    margin = WHAT_IF_MARGIN * (TPOT_NEAR_MARGIN_FACTOR if decision.action == Action.RAISE and tpot_near else 1.0)
    verdict = what_if_verdict(model, traffic, inp.current, _options(inp, w, decision, lo, hi, ahead is not None),
                              restart_cost_seconds(inp.cost, load), PLANNING_HORIZON_SECONDS, margin,
                              for_gain=not protective, ahead=ahead is not None)
    best, why, decline = verdict.best, verdict.why, verdict.decline
    lowers = best is not None and best < inp.current and not protective
    misread = over_read_gain(inp, traffic, decision, model, verdict.gain) if lowers else None
    if misread is not None:
        held = hold(inp, TunerReason.NO_PREDICTED_GAIN, f"{decision.message}; but {why}; {misread}")
        return replace(held, recheck_later=True)
    if best is not None:
        return replace(decision, target=best, message=f"{decision.message}; {why}; chose {best}")
    if decline == Decline.NO_FIT:
        return decision  # nothing to replay: the rules decide alone
    if decline == Decline.UNPLACEABLE:
        return replace(decision, message=f"{decision.message}; {why}")
    # NO_GAIN or YOUNG_ERROR (a verdict without a reason is read as NO_GAIN: it holds, never lets a change through).
    waits = waits_for_settling(unsettled, verdict, inp.what_if.calibrated, model.model_error)
    if waits is not None:
        return hold(inp, TunerReason.TPOT_BREAK_UNCONFIRMED, f"{decision.message}; but {why}; {waits}")
    if protective:
        return replace(decision, message=f"{decision.message}; {why}: no candidate beats staying put in the "
                       f"model, but the measurements call for it and the model cannot veto it")
    held = hold(inp, TunerReason.NO_PREDICTED_GAIN, f"{decision.message}; but {why}: no candidate beats staying put")
    # A decline that stands is recorded in status: the simulation reruns only RECHECK_SECONDS later.
    return replace(held, recheck_later=decline != Decline.YOUNG_ERROR)
