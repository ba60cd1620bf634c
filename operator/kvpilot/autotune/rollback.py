"""What is measured overrules what is predicted (issue 18): the rule that rolls back a change verification found
harmful, and the bars a rollback leaves. Pure.

* ``rolled_back``: when the change under verification serves measurably worse than the value before it did
  (autotune/verify.py), the decision is to go back to that value at once. It waits for nothing: not the
  cooldown, not the what-if (a model that was wrong about the change cannot veto undoing it), not the
  guarantees against flapping (a rollback is no oscillation: the pair cancels out, and
  ``desired/tuning.recent_changes`` leaves both out of the reversal budget).
* ``within_bars``: a change proposed into a direction verification barred is moved to just inside the bar when
  that is still a step worth a restart, else held. A rollback bars the failed half of its direction for the
  planning horizon (all of it after a second failure: ``bars.bar_after_rollback``); a lower kept because it
  served no worse, but no better, bars further lowers (it did not remove the cause). Bars hold at the load they
  were measured at.
* ``verified_first``: no second change in the same direction while the first has no verdict, unless most
  requests miss (or requests are paused).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from kvpilot.api.status import Action
from kvpilot.autotune.constants import MIN_RELATIVE_STEP, SEVERE_MISSES
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import TunerInput, bounds, hold
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.shift import OVERLAP_SHARE
from kvpilot.autotune.verify import Outcome, same_load
from kvpilot.autotune.window import KvWindow

# How old the last pass's traffic record may be to witness a load that moved (``load_moved``): the length of a
# rolling restart with a spare GPU (90 s to Ready) and a window or two.
MOVED_RECORD_SECONDS = 120.0


def rolled_back(inp: TunerInput) -> Decision | None:
    """Back to the value that served well, when verification says the change in force serves worse; None
    otherwise (no change under verification, no verdict yet, or the value moved since by other means)."""
    memory = inp.history.verification
    watch, verdict = memory.watch, memory.verdict(inp.now.timestamp())
    if watch is None or verdict is None or verdict.outcome != Outcome.ROLL_BACK or inp.current != watch.to_value:
        return None
    lo, hi = bounds(inp)
    target = max(lo, min(hi, watch.from_value))
    if target == inp.current:
        return None
    action = Action.LOWER if target < inp.current else Action.RAISE
    return Decision(action, target, TunerReason.ROLLED_BACK,
                    f"Rolled back {inp.current}->{target}: {verdict.message}")


def window_load(w: KvWindow | None) -> tuple[float, float] | None:
    """The window's load: offered requests per second over all its pods, and the mean prompt (None: unknown)."""
    if w is None or w.arrival_rate <= 0:
        return None
    return w.arrival_rate * max(1, w.pods), w.prompt_mean


def load_moved(inp: TunerInput, w: KvWindow, reference: tuple[float, float] | None) -> bool:
    """The traffic changed since ``reference`` (offered requests per second, mean prompt) beyond verification's
    tolerances, and stayed changed: this window, and an earlier witness (one noisy window is no phase shift).
    False when any is unknown."""
    now = window_load(w)
    if reference is None or now is None or same_load(now, reference, w.window_seconds):
        return False
    return _baseline_moved(inp, reference) or _record_moved(inp, w, now, reference)


def _baseline_moved(inp: TunerInput, reference: tuple[float, float]) -> bool:
    """The baseline at the limit in force, which restarts when the load moves and so holds only windows at the
    new load, moved from ``reference`` on at least two of them."""
    base = inp.history.verification.baseline.side
    return base.windows >= 2 and base.seconds > 0 and \
        not same_load((base.offered_per_s, base.prompt_mean), reference, base.seconds)


def _record_moved(inp: TunerInput, w: KvWindow, now: tuple[float, float], reference: tuple[float, float]) -> bool:
    """The traffic the last pass recorded (status.kvCache.traffic), at most MOVED_RECORD_SECONDS old, moved from
    ``reference`` too (``now``: this window's load). Unlike the baseline it is kept across a rollout, whose mixed limits no baseline counts:
    measured on the suite's document Q&A then chat case on an engine decoding 30% slow (docs/tuner-suite.md,
    "Eleventh pass"), a raise for the Q&A rolled out as chat arrived, and the raise chat called for then waited
    45 s after it for two settled windows at the new limit, with four windows at chat's load seen while it rolled.
    The record must also agree with this window: it keeps a rate per pod, read here with this window's pods, so
    a record written while a rollout changed the pod count reads as another load and witnesses nothing; so does
    one that moved the other way. A record younger than OVERLAP_SHARE of a window shares its samples (a pass that
    came early) and is no second witness."""
    seen = inp.history.last_traffic
    if seen is None or seen.age_s is None:
        return False
    if not OVERLAP_SHARE * w.window_seconds <= seen.age_s <= MOVED_RECORD_SECONDS:
        return False
    recorded = (seen.rate_per_pod * max(1, w.pods), seen.prompt_mean)
    return same_load(recorded, now, w.window_seconds) and not same_load(recorded, reference, w.window_seconds)


def verified_first(inp: TunerInput, w: KvWindow, decision: Decision) -> Decision:
    """No second change in the same direction before the first one has a verdict: steps that are each within
    the noise add up unseen (a limit lowered three times for a TPOT objective that lowering does not fix).
    Most requests missing an objective waits for nothing, and nor does traffic that changed since the change
    (its verdict could only be reached at the old load; measured on the suite's document Q&A then chat case, a
    raise for chat waited 8 minutes on the verdict of a raise made for the Q&A traffic)."""
    pending = inp.history.verification.pending(inp.now.timestamp())
    if pending is None or not decision.changes or decision.reason == TunerReason.OUT_OF_BOUNDS:
        return decision
    base = pending.baseline
    if base.seconds > 0 and load_moved(inp, w, (base.offered_per_s, base.prompt_mean)):
        return decision
    if (decision.target > inp.current) != (pending.to_value > pending.from_value):
        return decision
    if w.miss_share >= SEVERE_MISSES or w.paused > 0:
        return decision
    return hold(inp, TunerReason.AWAITING_VERIFICATION, f"{decision.message}; but the change {pending.from_value}->"
                f"{pending.to_value} has no verdict yet: one step at a time")


def within_bars(inp: TunerInput, decision: Decision) -> Decision:
    """``decision`` kept clear of the bars verification left: moved to just inside one, or held."""
    if decision.action not in (Action.RAISE, Action.LOWER) or decision.reason in (TunerReason.OUT_OF_BOUNDS,
                                                                                  TunerReason.ROLLED_BACK):
        return decision  # a rollback goes back to the value that served well, as verification's does
    now = inp.now.timestamp()
    bar = inp.history.verification.barred(inp.current, decision.target, now, window_load(inp.window))
    if bar is None:
        return decision
    until = datetime.fromtimestamp(bar.until_s, timezone.utc).strftime("%H:%M:%SZ")
    inside = bar.limit - 1 if bar.upward else bar.limit + 1
    why = (f"{decision.message}; but verification barred {'raises to' if bar.upward else 'lowers to'} {bar.limit} "
           f"and beyond at this load until {until}")
    worth = abs(inside - inp.current) >= MIN_RELATIVE_STEP * inp.current
    if (inside > inp.current) != bar.upward or not worth:
        return hold(inp, TunerReason.BARRED_BY_VERIFICATION, why)
    return replace(decision, target=inside, message=f"{why}: {inside} instead")
