"""The guarantees every change must pass, whatever proposed it (the rules or the what-if simulation).

Traffic changes, so a change may later be undone, but never by flapping: never back to a value left within a
planning horizon, past it only on strong evidence of the opposite kind, and at most one reversal per horizon
(``oscillation``); a lower right after a raise needs stronger evidence than the raise had; a raise must
promise real capacity (``no_harm``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvpilot.api.status import Action
from kvpilot.autotune.constants import (
    MIN_CAPACITY_GAIN,
    MIN_RELATIVE_STEP,
    PLANNING_HORIZON_SECONDS,
    SEVERE_MISSES,
    REVERSAL_MIN_TPOT_MISSES,
    REVERSAL_MIN_TTFT_MISSES,
    UNDO_MIN_TPOT_MISSES,
)
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import TunerInput, bounds, hold
from kvpilot.autotune.signals import capacity_gain, tpot_margin
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.reasons import PROTECTIVE_REASONS, TunerReason


def undo_evidence(inp: TunerInput, w: KvWindow, decision: Decision) -> str | None:
    """Why undoing a recent change is warranted (None: it is not): the opposite signal, strongly. A lower past
    where a raise started needs most requests to miss TPOT (paused requests alone say the raise went too far,
    which a lower that stays above where it started fixes); a raise past where a lower started needs many
    TTFT misses with TPOT headroom. Under steady traffic a value cannot fail one way and its neighbour on the
    other side fail the other way, so this lets the tuner follow a phase shift without letting it flap."""
    if decision.action == Action.LOWER:
        if (w.tpot_miss_fraction or 0.0) >= UNDO_MIN_TPOT_MISSES:
            return "most requests now miss the TPOT objective"
        return None
    if (w.ttft_miss_fraction or 0.0) >= REVERSAL_MIN_TTFT_MISSES and tpot_margin(inp.spec.slo, w):
        return "requests now queue with TPOT headroom"
    return None


def oscillation(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision:
    """No A->B->A within a planning horizon (see ``no_harm``): the decision, moved clear of every value A the
    limit left within the horizon, or a hold."""
    horizon = PLANNING_HORIZON_SECONDS
    recent = [c for c in inp.history.recent_changes if (inp.now - c.at).total_seconds() < horizon]  # newest first
    lower = decision.action == Action.LOWER
    directions = [lower] + [c.to_value < c.from_value for c in recent]
    flips = sum(1 for a, b in zip(directions, directions[1:]) if a != b)
    # A protective lower with most requests missing TPOT is a measurement calling for it (issue 18): the reversal
    # budget, like the what-if, does not veto it (measured: on an engine decoding 30% slower than its profile, a
    # raise to 456 for chat traffic after a lower for document Q&A broke TPOT and was held there for 13 minutes).
    severe = lower and decision.reason in PROTECTIVE_REASONS and (w.tpot_miss_fraction or 0.0) >= SEVERE_MISSES
    if len(directions) > 1 and directions[0] != directions[1] and flips > 1 and not severe:
        return hold(inp, TunerReason.WOULD_OSCILLATE, f"{decision.message}; but the limit changed direction once already "
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
            why = undo_evidence(inp, w, decision)
            if why is None:
                return hold(inp, TunerReason.WOULD_OSCILLATE, f"{held}: no A->B->A within a planning horizon")
            undone[a] = why
            if a / band <= decision.target <= a * band:
                # Never back to A itself: past it, by a step worth a restart, or not at all.
                past = math.floor(a / band) if lower else math.ceil(a * band)
                if not lo <= past <= hi or (past >= inp.current if lower else past <= inp.current):
                    if severe and lo <= a < inp.current:
                        # The floor is A: past it is out of bounds, and holding would keep most requests missing
                        # TPOT at B for the horizon. Back to A is the measured way out: when B is the last change,
                        # it is that change's rollback (measured worse: most requests miss at B), not a reversal.
                        last = change is recent[0] and change.to_value == inp.current
                        decision = replace(decision, target=a, reason=TunerReason.ROLLED_BACK if last else
                                           decision.reason, message=f"{decision.message}; back to {a}, the floor: "
                                           f"most requests miss TPOT at {inp.current}")
                        continue
                    return hold(inp, TunerReason.WOULD_OSCILLATE, f"{held}: no A->B->A, and past {a} is out of bounds")
                decision = replace(decision, target=past, message=f"{decision.message}; past {a}, not back to it")
                moved = True
        if not moved:
            break
    for a, why in undone.items():
        decision = replace(decision, message=f"{decision.message}; undoing the change from {a}: {why}")
    return decision


def no_harm(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision:
    """The guarantees every change must pass, whatever proposed it.

    * no A->B->A within a planning horizon: a change never returns to (within a restart-worthy step of) a value
      the limit left less than a horizon ago; it may go past it only on strong evidence of the opposite kind
      (the traffic changed: ``undo_evidence``), and at most once per horizon;
    * a lower right after a raise needs stronger evidence than the raise had: paused requests, or a large
      share of TPOT misses (a p95 over the objective alone is not enough);
    * a raise must promise real capacity (the fitted step latency says decode throughput grows by
      MIN_CAPACITY_GAIN at least): when the iteration time grows as fast as the batch, a larger batch only
      makes every token slower.
    """
    if decision.action not in (Action.RAISE, Action.LOWER):
        return decision
    horizon = PLANNING_HORIZON_SECONDS
    decision = oscillation(inp, w, decision)
    if not decision.changes:
        return decision
    changes = inp.history.recent_changes
    last = changes[0] if changes else None
    if (decision.action == Action.LOWER and last is not None and last.to_value > last.from_value
            and (inp.now - last.at).total_seconds() < horizon):
        strong = w.paused > 0 or (w.tpot_miss_fraction or 0.0) >= REVERSAL_MIN_TPOT_MISSES
        if not strong:
            return hold(inp, TunerReason.RECENT_RAISE, f"{decision.message}; a lower right after a raise needs stronger "
                        f"evidence (paused requests or >= {REVERSAL_MIN_TPOT_MISSES:.0%} TPOT misses)")
    if decision.action == Action.RAISE and decision.reason != TunerReason.OUT_OF_BOUNDS:
        gain = capacity_gain(w, inp.current, decision.target)
        if gain < MIN_CAPACITY_GAIN:
            return hold(inp, TunerReason.NO_CAPACITY_GAIN, f"{decision.message}; but the fitted step latency predicts only "
                        f"x{gain:.2f} decode throughput at {decision.target}: not worth a restart")
    return decision
