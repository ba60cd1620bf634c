"""What the tuner keeps between decisions to verify its changes (issue 18), one window at a time. Pure.

The policy is a pure function of what status holds and of this interval's window, so the evidence for a
verdict is kept as running sums (``verify.Side``), never as a list of windows: status stays small however long a
verification takes.

* ``Baseline``: the clean windows at the limit in force, faded so that it weighs about the last two to four
  minutes, restarted when the limit or the load changes (the next change is judged against it);
* ``Watch``: one applied change under verification (the baseline it started from, the settling of the new
  limit, the comparable evidence since, and what was skipped);
* ``CanaryWatch``: one canary pod at the new limit beside pods at the old one, over the same windows.

``verify`` and ``verify_canary`` fold a sequence of windows through them (the tests' and the bench's way in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvpilot.autotune.constants import LASTING_BREAK_WINDOWS, REVERSAL_MIN_TPOT_MISSES
from kvpilot.autotune.bars import Bar, bar_after_rollback
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.verify import (BASELINE_SECONDS, CONFIRM_WINDOWS, MIN_EVIDENCE_SECONDS, MIN_REQUESTS,
                                     Outcome, Settle, Side, Verdict, WindowFigures, Why, clean, comparable, confirm,
                                     judge, undecided_or_give_up, unit_share)


@dataclass(frozen=True)
class Baseline:
    """The clean windows at ``limit`` once its batch has settled (``Settle``: a limit just put in force, or pods
    just started, serve an emptier batch than they will), the recent ones weighing most. Measured on the suite:
    without settling, the first 45 s of pods at 2048 under document Q&A traffic (95% served in time, before the
    batch filled and TPOT broke) made a right lower to 25 read as 30% worse."""

    limit: int | None = None
    side: Side = Side()
    settle: Settle = Settle()
    # The settled windows in a row at ``limit``, the last one taken included, in which REVERSAL_MIN_TPOT_MISSES or
    # more of the resolved requests missed an objective (up to LASTING_BREAK_WINDOWS): a break that lasts, told
    # from a swell of a window or two (rules._lasting_misses). A load that moves restarts ``side``, not the streak:
    # the windows in a row are still the pods' own.
    missing_streak: int = 0

    def observe(self, w: WindowFigures | None, limit: int) -> Baseline:
        """After this interval's window (None: no window) with ``limit`` in force."""
        if limit != self.limit:
            return Baseline(limit).observe(w, limit)
        if w is None or not clean(w, limit):
            return self
        settle = self.settle.step(w)
        if not settle.counts(w):
            return replace(self, settle=settle)
        side = self.side if self.side.windows == 0 or comparable(w, self.side) else Side()  # the load moved
        side = side.add(w)
        if side.seconds > 2 * BASELINE_SECONDS:
            side = side.faded()
        missing = 1.0 - w.served_share >= REVERSAL_MIN_TPOT_MISSES
        return Baseline(limit, side, settle, min(LASTING_BREAK_WINDOWS, self.missing_streak + 1) if missing else 0)


@dataclass(frozen=True)
class Watch:
    """An applied change ``from_value`` -> ``to_value`` (applied at ``change_at_s``) under verification."""

    change_at_s: float
    from_value: int
    to_value: int
    baseline: Side
    settle: Settle = Settle()
    after: Side = Side()
    other_load: int = 0  # settled windows left out because the load had changed
    # The judged windows in a row, up to this one, whose verdict was a rollback (verify.confirm: on thin evidence a
    # loss must show on two); kept in status, as the verdict is reached anew from it at every pass.
    worse: int = 0

    def observe(self, w: WindowFigures | None) -> Watch:
        if w is None or w.end_s <= self.change_at_s or not clean(w, self.to_value):
            return self
        settle = self.settle.step(w)
        if not settle.counts(w):
            return replace(self, settle=settle)
        if not comparable(w, self.baseline):
            return replace(self, settle=settle, other_load=self.other_load + 1)
        after = self.after.add(w)
        return replace(self, settle=settle, after=after, worse=_streak(self.worse, self.baseline, after))

    def verdict(self, now_s: float) -> Verdict:
        base, new = self.baseline, self.after
        if base.resolved < MIN_REQUESTS:
            return undecided_or_give_up(Why.NO_BASELINE, "no clean baseline window before the change", None, None,
                                        self.change_at_s, now_s)
        if new.windows == 0:
            if self.other_load:
                return undecided_or_give_up(Why.LOAD_CHANGED, f"the load changed since the change (baseline "
                                            f"{base.offered_per_s:.1f} req/s)", base, None, self.change_at_s, now_s)
            return undecided_or_give_up(Why.SETTLING, f"{self.to_value} is not yet in force on every pod, or its "
                                        f"batch has not settled", base, None, self.change_at_s, now_s)
        outcome, why, message = confirm(judge(base, new, f"at {self.from_value}", f"at {self.to_value}"), base, new,
                                        self.worse)
        if outcome == Outcome.UNDECIDED:
            return undecided_or_give_up(why, message, base, new, self.change_at_s, now_s)
        return Verdict(outcome, why, message, base, new)


def _streak(worse: int, base: Side, new: Side) -> int:
    """``worse`` after a judged window: one more when ``judge`` on the sides with it is a rollback, else 0."""
    if base.resolved < MIN_REQUESTS or judge(base, new, "", "")[0] != Outcome.ROLL_BACK:
        return 0
    return min(worse + 1, CONFIRM_WINDOWS)


def watch(baseline: Baseline, from_value: int, to_value: int, at_s: float) -> Watch:
    """Start verifying a change applied at ``at_s``, against the baseline at ``from_value`` (an empty one when
    the baseline was at another limit)."""
    return Watch(at_s, from_value, to_value, baseline.side if baseline.limit == from_value else Side())


@dataclass(frozen=True)
class CanaryWatch:
    """A canary pod at ``new_value`` beside pods at ``old_value``, started at ``started_at_s``. Both sides are the
    same windows (the same traffic at the same time, so no load change can confound them), the canary's from
    when its batch settled; each side counts the requests sent to its pods."""

    started_at_s: float
    old_value: int
    new_value: int
    settle: Settle = Settle()
    canary: Side = Side()
    others: Side = Side()
    worse: int = 0  # as Watch.worse

    def observe(self, canary: WindowFigures | None, others: WindowFigures | None) -> CanaryWatch:
        if canary is None or canary.end_s <= self.started_at_s or not clean(canary, self.new_value):
            return self
        settle = self.settle.step(canary)
        if not settle.counts(canary) or others is None or not clean(others, self.old_value):
            return replace(self, settle=settle)
        new, old = self.canary.add(canary), self.others.add(others)
        return replace(self, settle=settle, canary=new, others=old,
                       worse=_streak(self.worse, old, new))

    def verdict(self, now_s: float) -> Verdict:
        if self.canary.windows == 0:
            return undecided_or_give_up(Why.SETTLING, f"the canary at {self.new_value} is not Ready yet, or its "
                                        f"batch has not settled", None, None, self.started_at_s, now_s)
        if self.others.resolved < MIN_REQUESTS:
            return undecided_or_give_up(Why.NO_BASELINE, f"the pods at {self.old_value} resolved too few requests "
                                        f"beside the canary", None, self.canary, self.started_at_s, now_s)
        # A gain beyond the noise is promoted on a minute of evidence, as a loss is rolled back on one: every
        # interval judged holds the other pods at the old value (measured on long-output-a100 from 64, a canary
        # that waited for KEEP_SECONDS cost its good raise 2.7% of the run's goodput).
        outcome, why, message = confirm(judge(self.others, self.canary, f"the pods at {self.old_value} meanwhile",
                                              f"the canary at {self.new_value}", better_seconds=MIN_EVIDENCE_SECONDS),
                                        self.others, self.canary, self.worse)
        if outcome == Outcome.UNDECIDED:
            return undecided_or_give_up(why, message, self.others, self.canary, self.started_at_s, now_s)
        return Verdict(outcome, why, message, self.others, self.canary)


def verify(change_at_s: float, from_value: int, to_value: int, before: Sequence[WindowFigures],
           after: Sequence[WindowFigures], now_s: float) -> Verdict:
    """Keep, roll back or wait, for the change ``from_value`` -> ``to_value`` applied at ``change_at_s``, from the
    windows before it (``before``: those that ended by then count) and after it (``after``: those that ended
    since), in time order."""
    base = Baseline()
    for w in sorted((w for w in before if w.end_s <= change_at_s), key=lambda w: w.end_s):
        base = base.observe(w, from_value)
    state = watch(base, from_value, to_value, change_at_s)
    for w in sorted(after, key=lambda w: w.end_s):
        state = state.observe(w)
    return state.verdict(now_s)


def verify_canary(old_value: int, new_value: int, canary: Sequence[WindowFigures],
                  others: Sequence[WindowFigures], started_at_s: float, now_s: float) -> Verdict:
    """Promote (``Keep``), roll back or wait, for a canary pod at ``new_value`` beside pods at ``old_value``:
    ``canary`` and ``others`` are their windows (matched by ``end_s``)."""
    by_end = {w.end_s: w for w in others}
    state = CanaryWatch(started_at_s, old_value, new_value)
    for w in sorted(canary, key=lambda w: w.end_s):
        state = state.observe(w, by_end.get(w.end_s))
    return state.verdict(now_s)


def figures_from_window(w: KvWindow, end_s: float, limit: int | None, expected_pods: int,
                        restarted: bool = False) -> WindowFigures:
    """Verification's view of the tuner's window. Where the window counted the requests that met both
    objectives (``good_rate``, the benchmark's) they are used; otherwise the misses per objective bound them: at
    least 1 - TTFT misses - TPOT misses of the answered met both (the same estimate on both sides of a change, so
    the comparison stays fair). The batch is the mean batch; a request's lifetime about its p95 TTFT plus its mean
    output at the p95 TPOT."""
    seconds = w.window_seconds
    scale = max(1, w.pods) * seconds
    answered = w.completion_rate * scale
    if w.resolved_rate > 0:
        resolved, good = w.resolved_rate * scale, w.good_rate * scale
    else:
        met = max(0.0, 1.0 - (w.ttft_miss_fraction or 0.0) - (w.tpot_miss_fraction or 0.0))
        resolved, good = answered, answered * met
    lifetime = ((w.ttft_p95_ms or 0.0) + w.output_mean * (w.tpot_p95_ms or 0.0)) / 1e3
    tpot, ttft = w.tpot_miss_fraction, w.ttft_miss_fraction
    known = tpot is not None and ttft is not None and math.isfinite(tpot + ttft) and math.isfinite(answered)
    split = max(0.0, answered) if known else 0.0
    return WindowFigures(end_s, seconds, limit, w.pods, expected_pods, w.arrival_rate * scale, resolved, good,
                         answered, w.mean_active, lifetime, w.prompt_mean, w.output_mean,
                         restarted or w.rejected_samples > 0, _cv(w.arrival_cv), split,
                         split * unit_share(tpot), split * unit_share(ttft))


def _cv(cv: float | None) -> float:
    """The window's arrival cv as verification's load tolerance reads it (1 when unknown or not a number)."""
    return cv if cv is not None and math.isfinite(cv) and cv > 1.0 else 1.0


@dataclass(frozen=True)
class Memory:
    """Everything verification keeps between decisions (status.autotune.verification): the baseline at the limit
    in force, the change under verification, the bars rollbacks left, and what was seen last (a plan between two
    windows sees the same window again; a pod that restarted or changed makes its window no evidence)."""

    baseline: Baseline = Baseline()
    watch: Watch | None = None
    bars: tuple[Bar, ...] = ()
    seen_until_s: float | None = None
    pods: str = ""
    last: Verdict | None = None  # the last verdict reached (for status; not used to decide)
    decided_at_s: float | None = None
    # The load (offered requests per second, mean prompt) at the old value just before the last applied change:
    # a cooldown is for one load (autotune/policy.py). None: not measured.
    change_load: tuple[float, float] | None = None

    def observe(self, w: WindowFigures | None, limit: int, pods: str, now_s: float) -> Memory:
        """Take this interval's window (None: none) with ``limit`` in force; ``pods``: the serving pods and their
        restart counts. A window that overlaps the last one taken is skipped (it is mostly the same requests)."""
        bars = tuple(b for b in self.bars if b.until_s > now_s)
        if w is None or (self.seen_until_s is not None and w.start_s < self.seen_until_s - 0.1 * w.seconds):
            return replace(self, bars=bars)
        if self.pods and pods != self.pods:
            w = replace(w, restarted=True)  # a pod came, went or restarted: this window mixes two lives
        watch = self.watch.observe(w) if self.watch is not None else None
        return replace(self, baseline=self.baseline.observe(w, limit), watch=watch, bars=bars, seen_until_s=w.end_s,
                       pods=pods)

    def verdict(self, now_s: float) -> Verdict | None:
        return self.watch.verdict(now_s) if self.watch is not None else None

    def decided(self, *, from_value: int, to_value: int, applied: bool, rollback: bool, now_s: float,
                horizon_s: float) -> Memory:
        """After this interval's decision: a rollback bars the direction that failed and ends the watch; another
        applied change is watched (against the baseline at the value it left); a watch whose verdict is final
        (kept, or unverifiable) ends."""
        verdict = self.verdict(now_s)
        out = self
        if verdict is not None and verdict.outcome != Outcome.UNDECIDED:
            # A RollBack this pass did not act on (the policy held first: a rollout or build under way, a thin
            # window) keeps its watch, so the next pass reaches it again and rolls back; dropping it lost the
            # verdict and left the harmful limit in force.
            unacted = verdict.outcome == Outcome.ROLL_BACK and not rollback
            out = replace(out, last=verdict, decided_at_s=now_s, watch=self.watch if unacted else None)
            w = self.watch
            if w is not None and verdict.outcome == Outcome.KEEP and w.to_value < w.from_value \
                    and verdict.why != Why.BETTER:
                # A lower that served no better (protective: paused requests, KV pressure, TPOT broken; or one
                # that freed unused slots' memory) did not remove the cause, and a further lower at this load
                # would only give up capacity.
                out = replace(out, bars=(*out.bars, Bar(False, w.to_value - 1, now_s + horizon_s,
                                                        w.baseline.offered_per_s, w.baseline.prompt_mean))[-8:])
        if not applied or from_value == to_value:
            return out
        side = self.baseline.side  # at the value in force until now, measured just before this change
        load = (side.offered_per_s, side.prompt_mean) if side.seconds > 0 else None
        if rollback:
            # Verification's rollback undoes the watched change; the severe TPOT rule's (guarantees.oscillation)
            # undoes the last change, which may have been kept already: either way the failed direction is barred
            # at the load now, the load is kept for the cooldown, and a rollback is never itself watched (a
            # rollback of a rollback would be A->B->A->B).
            failed = self.watch if self.watch is not None and self.watch.to_value == from_value else None
            start, end = (failed.from_value, failed.to_value) if failed is not None else (to_value, from_value)
            measured = side if side.seconds > 0 or failed is None else failed.baseline
            bar = bar_after_rollback(start, end, now_s, horizon_s, out.bars, measured)
            return replace(out, watch=None, bars=(*out.bars, bar)[-8:], change_load=load,
                           last=verdict if verdict is not None else out.last,
                           decided_at_s=now_s if verdict is not None else out.decided_at_s)
        return replace(out, watch=watch(self.baseline, from_value, to_value, now_s), change_load=load)

    def barred(self, current: int, target: int, now_s: float, load: tuple[float, float] | None = None) -> Bar | None:
        """The bar that refuses ``current`` -> ``target`` now at ``load`` (requests per second, mean prompt), if any."""
        return next((b for b in self.bars if b.refuses(current, target, now_s, load)), None)

    def pending(self, now_s: float) -> Watch | None:
        """The change under verification while it has no verdict: not when the load has changed since (the
        traffic moved on, and the next change follows it). A change made before its value's baseline settled
        cannot be judged; it is pending until the value it set has a settled baseline of its own
        (MIN_EVIDENCE_SECONDS), so the next step in its direction can be judged against it, rather than an
        unmeasured step added to an unmeasured one."""
        verdict = self.verdict(now_s)
        if verdict is None or verdict.outcome != Outcome.UNDECIDED or verdict.why == Why.LOAD_CHANGED:
            return None
        if verdict.why == Why.NO_BASELINE and self.baseline.side.seconds >= MIN_EVIDENCE_SECONDS:
            return None
        return self.watch
