"""Verification of an applied change: what is measured overrules what was predicted (issue 18). Pure.

The tuner's what-if predicts with a model of the engine, and a real engine is not its model: an engine that
decodes 20% slower than its profile turned a retune the model scored as a gain into an 83% loss. So after every
applied change the tuner compares what the new limit serves with what the old one served just before, at
comparable offered load, and decides:

* ``Keep``: after enough clean evidence the new limit serves no worse (or better);
* ``RollBack``: it serves measurably worse: back to the value that was serving well, at once;
* ``Undecided``: not enough clean evidence yet (still settling, too few requests, the load changed).

The figure compared is the share of the requests resolved in a window (answered, shed or given up) that met both
objectives: it counts a request shed or left unanswered as a miss, so a change that serves fewer requests, all
in time, is not read as a gain. SLO attainment (good over answered) is reported beside it. The offered load
(arrivals) only says whether the two sides are comparable.

It must never roll back for noise. A window is left out when it cannot be compared:

* scrape gaps: fewer pods reported than serve (``pods < expected_pods``), or a window with no traffic figures;
* a pod restarted by something else, or a counter went back (``restarted``): that window's deltas mix two lives;
* a rollout still running (the pods run different limits: ``limit`` is None) or a limit other than the side's;
* a load change: offered load off the baseline's by more than ``LOAD_TOLERANCE``, or a mix (mean prompt or
  output) off by more than ``MIX_TOLERANCE``: the figure moves with the load, not only with the limit.

Then the difference must exceed the noise: ``Z`` standard errors of the two sides' means (from the scatter of the
windows, never below the binomial error of their request counts) and at least ``MIN_DROP`` of the offered load.
The new limit's first windows are not evidence either: a raised batch fills over a request's lifetime, and a
TPOT cliff shows in the finished requests only a lifetime after it has (``settled``: one mean request latency
after the mean batch stopped growing, or ``MAX_SETTLE_SECONDS`` after the limit came into force). A side of one
window has no scatter of its own; the other side's stands in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

BASELINE_SECONDS = 120.0  # the clean windows at the old limit just before the change that make the baseline
MIN_EVIDENCE_SECONDS = 60.0  # clean settled windows at the new limit before a rollback may be decided
# A drop this large (of the resolved requests served in time, beyond the noise bound too) is decided on half the
# evidence: at a TPOT cliff every interval waited costs most of the traffic.
CLEAR_DROP = 0.25
KEEP_SECONDS = 120.0  # clean settled windows at the new limit before a change is kept
GIVE_UP_SECONDS = 900.0  # after this long without a comparable window, stop: the change stays, unverified
MIN_REQUESTS = 40  # resolved requests on a side before its share means anything
LOAD_TOLERANCE = 0.20  # offered load within +/-20% of the baseline's
MIX_TOLERANCE = 0.25  # mean prompt and output within +/-25% of the baseline's
MIN_DROP = 0.05  # the share served in time must fall by at least 5% of the offered load
Z = 3.5  # and by this many standard errors of the difference
# A window's share scatters by at least this much from window to window (bursts, long requests finishing in one
# window rather than the next): few windows may by chance scatter less, and the bound must not trust that.
MIN_WINDOW_SPREAD = 0.06
SETTLE_GROWTH = 0.10  # settled once the mean batch grows by less than 10% from one window to the next
MAX_SETTLE_SECONDS = 180.0  # settled at the latest this long after the new limit is in force on every pod


class Outcome(StrEnum):
    KEEP = "Keep"
    ROLL_BACK = "RollBack"
    UNDECIDED = "Undecided"


class Why(StrEnum):
    """Why the verdict is what it is (a typed reason: compared, never parsed from the message)."""

    WORSE = "ServesWorse"
    NO_WORSE = "ServesNoWorse"
    BETTER = "ServesBetter"
    NO_BASELINE = "NoBaseline"
    SETTLING = "Settling"
    TOO_LITTLE_EVIDENCE = "TooLittleEvidence"
    LOAD_CHANGED = "LoadChanged"
    GAVE_UP = "Unverifiable"


@dataclass(frozen=True)
class WindowFigures:
    """What one tuning window measured, as verification reads it. ``end_s``: when the window ended (any clock,
    only differences count); ``limit``: the max_batch_size every reporting pod ran (None: mixed, a rollout is
    under way); ``offered``: requests that arrived (fleet); ``good``: requests that met both objectives;
    ``resolved``: requests answered, shed or given up in the window; ``answered``: of those, answered (the
    attainment's denominator); ``batch``: the mean batch per pod; ``latency_s``: the mean time from arrival to
    answer of the requests answered; ``restarted``: a pod restarted or a counter went back in the window, not
    by a change of the tuner's."""

    end_s: float
    seconds: float
    limit: int | None
    pods: int
    expected_pods: int
    offered: float
    resolved: float
    good: float
    answered: float
    batch: float = 0.0
    latency_s: float = 0.0
    prompt_mean: float = 0.0
    output_mean: float = 0.0
    restarted: bool = False

    @property
    def served_share(self) -> float:
        """Good requests over resolved ones (1 when nothing was resolved)."""
        return min(1.0, self.good / self.resolved) if self.resolved > 0 else 1.0


@dataclass(frozen=True)
class Side:
    """The pooled figures of the windows on one side of a change."""

    windows: int
    seconds: float
    offered: float
    resolved: float
    good: float
    answered: float
    share: float  # good over resolved, pooled
    spread: float  # standard deviation of the windows' shares
    prompt_mean: float
    output_mean: float

    @property
    def offered_per_s(self) -> float:
        return self.offered / self.seconds if self.seconds > 0 else 0.0

    @property
    def goodput_per_s(self) -> float:
        return self.good / self.seconds if self.seconds > 0 else 0.0

    @property
    def attainment(self) -> float | None:
        return min(1.0, self.good / self.answered) if self.answered > 0 else None

    def text(self) -> str:
        att = "n/a" if self.attainment is None else f"{self.attainment:.0%}"
        return (f"{self.goodput_per_s:.2f} good req/s, {self.offered_per_s:.2f} offered, {self.share:.0%} of those "
                f"resolved in time (attainment {att}) over {self.seconds:.0f}s")


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    why: Why
    message: str
    before: Side | None = None
    after: Side | None = None


def pool(windows: Sequence[WindowFigures]) -> Side | None:
    """The windows' figures together; None for no window."""
    if not windows:
        return None
    seconds = sum(w.seconds for w in windows)
    offered = sum(w.offered for w in windows)
    resolved = sum(w.resolved for w in windows)
    good = sum(w.good for w in windows)
    shares = [w.served_share for w in windows]
    mean = sum(shares) / len(shares)
    spread = math.sqrt(sum((s - mean) ** 2 for s in shares) / (len(shares) - 1)) if len(shares) > 1 else 0.0
    weight = offered or 1.0
    return Side(len(windows), seconds, offered, resolved, good, sum(w.answered for w in windows),
                min(1.0, good / resolved) if resolved > 0 else 1.0, spread,
                sum(w.prompt_mean * w.offered for w in windows) / weight,
                sum(w.output_mean * w.offered for w in windows) / weight)


def clean(w: WindowFigures, limit: int) -> bool:
    """A window that can be evidence for ``limit``: every pod reported, none restarted, all ran ``limit``."""
    return (w.limit == limit and w.expected_pods > 0 and w.pods >= w.expected_pods and not w.restarted
            and w.seconds > 0 and all(math.isfinite(x) and x >= 0 for x in (w.offered, w.resolved, w.good)))


def baseline(windows: Sequence[WindowFigures], limit: int, change_at_s: float) -> list[WindowFigures]:
    """The clean windows at ``limit`` that ended before the change, the newest BASELINE_SECONDS of them."""
    before = sorted((w for w in windows if w.end_s <= change_at_s and clean(w, limit)), key=lambda w: w.end_s)
    out: list[WindowFigures] = []
    for w in reversed(before):
        if sum(x.seconds for x in out) >= BASELINE_SECONDS:
            break
        out.append(w)
    return out[::-1]


def settled(windows: Sequence[WindowFigures], limit: int) -> list[WindowFigures]:
    """The clean windows at ``limit`` once they say what the limit does: from one mean request latency after the
    first window whose mean batch grew by less than SETTLE_GROWTH over the one before it (the requests answered
    then lived their whole life in the settled batch), or from MAX_SETTLE_SECONDS after the limit was first in
    force on every pod."""
    ordered = sorted((w for w in windows if clean(w, limit)), key=lambda w: w.end_s)
    if not ordered:
        return []
    in_force = ordered[0].end_s - ordered[0].seconds
    start = in_force + MAX_SETTLE_SECONDS
    for k in range(1, len(ordered)):
        if ordered[k].batch <= (1.0 + SETTLE_GROWTH) * ordered[k - 1].batch:
            start = min(start, ordered[k].end_s + ordered[k].latency_s)
            break
    return [w for w in ordered if w.end_s - w.seconds >= start - 1e-9]


def comparable(w: WindowFigures, base: Side) -> bool:
    """The window's load is the baseline's, within the tolerances (rate and mix)."""
    rate = w.offered / w.seconds
    if not _near(rate, base.offered_per_s, LOAD_TOLERANCE):
        return False
    return all(_near(a, b, MIX_TOLERANCE) for a, b in ((w.prompt_mean, base.prompt_mean),
                                                       (w.output_mean, base.output_mean)) if a > 0 and b > 0)


def _near(a: float, b: float, tolerance: float) -> bool:
    if b <= 0:
        return a <= 0
    return abs(a / b - 1.0) <= tolerance


def noise(before: Side, after: Side) -> float:
    """The standard error of the difference of the two sides' shares, as if the change changed nothing (the
    hypothesis a rollback must reject): the binomial error of the pooled share over each side's resolved
    requests, or, where larger, the windows' scatter (bursts make whole windows better or worse, so requests in
    one window are not independent): the larger of the two sides', never below MIN_WINDOW_SPREAD."""
    resolved = before.resolved + after.resolved
    p = min(max((before.good + after.good) / resolved if resolved > 0 else 0.5, 0.01), 0.99)
    spread = max(before.spread, after.spread, MIN_WINDOW_SPREAD)

    def var(side: Side) -> float:
        return max(p * (1 - p) / max(1.0, side.resolved), spread ** 2 / side.windows)

    return math.sqrt(var(before) + var(after))


def verify(change_at_s: float, from_value: int, to_value: int, before: Sequence[WindowFigures],
           after: Sequence[WindowFigures], now_s: float) -> Verdict:
    """Keep, roll back or wait, for the change ``from_value`` -> ``to_value`` applied at ``change_at_s``, from the
    windows before it (``before``) and after it (``after``)."""
    base = pool(baseline(before, from_value, change_at_s))
    if base is None or base.resolved < MIN_REQUESTS:
        return _undecided_or_give_up(Why.NO_BASELINE, "no clean baseline window before the change", None, None,
                                     change_at_s, now_s)
    ready = settled([w for w in after if w.end_s > change_at_s], to_value)
    if not ready:
        return _undecided_or_give_up(Why.SETTLING, f"{to_value} is not yet in force on every pod, or its batch "
                                     f"still grows", base, None, change_at_s, now_s)
    same_load = [w for w in ready if comparable(w, base)]
    new = pool(same_load)
    if new is None:
        return _undecided_or_give_up(Why.LOAD_CHANGED, f"the load changed since the change (baseline "
                                     f"{base.offered_per_s:.1f} req/s)", base, None, change_at_s, now_s)
    drop = base.share - new.share
    bound = max(MIN_DROP, Z * noise(base, new))
    figures = f"before, at {from_value}: {base.text()}; after, at {to_value}: {new.text()}"
    enough = new.resolved >= MIN_REQUESTS
    if enough and _evidence_enough(new, drop, bound):
        return Verdict(Outcome.ROLL_BACK, Why.WORSE, f"{to_value} serves {drop:.0%} less of the offered load in "
                       f"time than {from_value} did (noise bound {bound:.0%}); {figures}", base, new)
    if enough and new.seconds >= KEEP_SECONDS:
        why = Why.BETTER if -drop > bound else Why.NO_WORSE
        return Verdict(Outcome.KEEP, why, f"{to_value} serves {-drop:+.0%} of the offered load in time against "
                       f"{from_value} (noise bound {bound:.0%}); {figures}", base, new)
    return _undecided_or_give_up(Why.TOO_LITTLE_EVIDENCE, f"{new.seconds:.0f}s of comparable evidence so far; "
                                 f"{figures}", base, new, change_at_s, now_s)


def _evidence_enough(new: Side, drop: float, bound: float) -> bool:
    """A measured loss: beyond the bound over MIN_EVIDENCE_SECONDS, or CLEAR_DROP over half of that."""
    if drop <= bound:
        return False
    return new.seconds >= MIN_EVIDENCE_SECONDS or (drop >= CLEAR_DROP and new.seconds >= MIN_EVIDENCE_SECONDS / 2)


def _undecided_or_give_up(why: Why, message: str, base: Side | None, new: Side | None, change_at_s: float,
                          now_s: float) -> Verdict:
    """Undecided; past GIVE_UP_SECONDS the change is kept as it is, unverified (never rolled back for want of
    evidence: a rollback needs a measured loss)."""
    if now_s - change_at_s >= GIVE_UP_SECONDS:
        return Verdict(Outcome.KEEP, Why.GAVE_UP, f"no verdict {GIVE_UP_SECONDS:.0f}s after the change ({message}); "
                       f"kept unverified", base, new)
    return Verdict(Outcome.UNDECIDED, why, message, base, new)


def verify_canary(old_value: int, new_value: int, canary: Sequence[WindowFigures],
                  others: Sequence[WindowFigures], started_at_s: float, now_s: float) -> Verdict:
    """Promote (``Keep``), roll back or wait, for a canary pod at ``new_value`` beside pods still at
    ``old_value`` behind the same balancer. The two sides are the same windows (the same traffic at the same
    time, so no load change can confound them), the canary's from when its batch settled; each side counts the
    requests sent to its pods. The balancer may send the canary more or less than its share (a least-loaded one
    favours the pod with room): what is compared is how well each pod serves what it is sent."""
    ready = settled([w for w in canary if w.end_s > started_at_s], new_value)
    if not ready:
        return _undecided_or_give_up(Why.SETTLING, f"the canary at {new_value} is not Ready yet, or its batch "
                                     f"still grows", None, None, started_at_s, now_s)
    ends = {w.end_s for w in ready}
    base = pool([w for w in others if w.end_s in ends and clean(w, old_value)])
    new = pool(ready)
    assert new is not None
    if base is None or base.resolved < MIN_REQUESTS:
        return _undecided_or_give_up(Why.NO_BASELINE, f"the pods at {old_value} gave no clean window beside the "
                                     f"canary", None, new, started_at_s, now_s)
    drop = base.share - new.share
    bound = max(MIN_DROP, Z * noise(base, new))
    figures = f"canary at {new_value}: {new.text()}; the pods at {old_value} meanwhile: {base.text()}"
    enough = new.resolved >= MIN_REQUESTS
    if enough and _evidence_enough(new, drop, bound):
        return Verdict(Outcome.ROLL_BACK, Why.WORSE, f"the canary serves {drop:.0%} less of what it is sent in time "
                       f"than the pods at {old_value} (noise bound {bound:.0%}); {figures}", base, new)
    if enough and new.seconds >= KEEP_SECONDS:
        why = Why.BETTER if -drop > bound else Why.NO_WORSE
        return Verdict(Outcome.KEEP, why, f"the canary serves {-drop:+.0%} of what it is sent in time against the "
                       f"pods at {old_value} (noise bound {bound:.0%}): promote; {figures}", base, new)
    return _undecided_or_give_up(Why.TOO_LITTLE_EVIDENCE, f"{new.seconds:.0f}s of settled canary evidence so far; "
                                 f"{figures}", base, new, started_at_s, now_s)


@dataclass(frozen=True)
class Bar:
    """After a rollback: no change in that direction (``upward``) to ``limit`` or beyond it until ``until_s``."""

    upward: bool
    limit: int
    until_s: float

    def refuses(self, current: int, target: int, now_s: float) -> bool:
        if now_s >= self.until_s or (target > current) != self.upward:
            return False
        return target >= self.limit if self.upward else target <= self.limit


def bar_after_rollback(from_value: int, to_value: int, at_s: float, horizon_s: float,
                       earlier: Sequence[Bar] = ()) -> Bar:
    """The bar a rollback of ``from_value`` -> ``to_value`` leaves for the planning horizon: the geometric midpoint
    between the value that served well and the one that failed, and everything beyond it (the next try in that
    direction goes at most half as far, in ratio); a second rollback in the same direction within the horizon
    bars the whole direction. Why not the whole direction at once: on issue 18's example (an engine 20% slower
    than its profile, the cliff above 256), a raise 64 -> 512 fails while 64 -> 128 serves 1.42x what 64 does."""
    upward = to_value > from_value
    if any(b.upward == upward and b.until_s > at_s for b in earlier):
        whole = from_value + 1 if upward else from_value - 1
        return Bar(upward, whole, at_s + horizon_s)
    mid = math.sqrt(from_value * to_value)
    return Bar(upward, math.ceil(mid) if upward else math.floor(mid), at_s + horizon_s)
