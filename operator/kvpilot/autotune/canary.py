"""A canary retune (issue 18, "Canary retunes"): one pod at the new limit beside the pods at the old one, judged
against them over the same windows, then promoted to every pod or rolled back. Pure.

Why a canary: verification (``verification.Watch``) judges a change after every pod has restarted onto it, so a
bad change costs every pod's traffic until it is caught. Measured in the benchmark (``python -m
kvpilot.bench.canary``, long-output-a100 on an engine decoding ~20% slower than its profile, 64 -> 512 onto a
TPOT cliff): without a spare GPU a canary lost 1,559 good requests where verification after the full rollout lost
3,719; with one, -280 against 210. A canary also compares two groups measured at the same time, so no load change
can confound it.

Which changes get one (``wants_canary``): a change the tuner proposes for a gain (a raise for queueing requests, a
lower that frees unused slots, the what-if's choice). Not a change the measurements demand (requests paused, KV
pressure, TPOT broken: every pod needs it now), a rollback (back to a value that served well), or a correction
into the user's bounds. And only where a canary can be compared: a Deployment of two or more pods.

The life of one, kept in status (``status.autotune.canary``) as running sums like verification's watch:

* ``Running``: the canary pod runs the new limit. With a spare GPU it starts beside the N old pods, and once it
  is Ready the old pods scale to N-1 (capacity never drops, and the canary serves the 1/N share it will have
  once promoted); without one the old pods scale to N-1 at once and the canary takes the GPU freed. Its
  windows and the other pods' are compared (``verification.CanaryWatch``: the same noise rules as
  verification). Keep -> ``Promoting``; RollBack -> ended; no verdict within ``GIVE_UP_SECONDS`` -> rolled back
  (a canary that cannot be judged is not worth keeping; a change already in force is, which is why verification
  keeps one it cannot judge).
* ``Promoting``: the old pods take the new limit and scale back to N; the canary pod stays until they have
  rolled where a spare GPU let it start beside them, else it leaves at once (its GPU is the one the N-th pod
  needs). The promoted change is then verified as any other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from kvpilot.autotune.decision import Decision
from kvpilot.api.status import Action
from kvpilot.autotune.reasons import PROTECTIVE_REASONS, TunerReason
from kvpilot.autotune.verification import CanaryWatch
from kvpilot.autotune.verify import GIVE_UP_SECONDS, Outcome, Verdict, WindowFigures, Why

# The tuner's decisions that are not tried on a canary first: the measurements call for them on every pod now (a
# protective lower), they go back to a value that served well (a rollback), or the user's bounds demand them.
NOT_CANARIED = (*PROTECTIVE_REASONS, TunerReason.ROLLED_BACK, TunerReason.OUT_OF_BOUNDS)
MIN_REPLICAS = 2  # a canary is compared with pods beside it: one replica has none


class Phase(StrEnum):
    """``status.autotune.canary.phase``."""

    RUNNING = "Running"  # one pod at the new limit, judged against the others
    PROMOTING = "Promoting"  # the others take the new limit; the canary leaves once they have


class Ending(StrEnum):
    """``status.autotune.canary.outcome``: how the last canary ended."""

    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"  # it served worse (or its pod could not run it)
    ABANDONED = "Abandoned"  # ended without a verdict on its value: the spec, the engine or the old pods moved on


def wants_canary(decision: Decision | None, replicas: int, multinode: bool, enabled: bool) -> bool:
    """Whether an applied ``decision`` is tried on one pod first (see the module's docstring)."""
    return (enabled and decision is not None and not multinode and replicas >= MIN_REPLICAS
            and decision.action in (Action.RAISE, Action.LOWER) and decision.reason not in NOT_CANARIED)


@dataclass(frozen=True)
class Canary:
    """One canary: ``from_value`` -> ``to_value``, started at ``started_at_s`` (the tuner's reason for the change
    in ``reason``). ``spare``: it started beside every old pod (a free GPU), not in place of one; ``ready_at_s``:
    when its pod was first Ready (the old pods then scale down by one, and never back up while it runs).
    ``seen_until_s`` and ``pods`` skip a window seen twice, and one whose pods came, went or restarted."""

    phase: Phase
    from_value: int
    to_value: int
    started_at_s: float
    spare: bool
    reason: str = ""
    ready_at_s: float | None = None
    watch: CanaryWatch | None = None
    seen_until_s: float | None = None
    pods: str = ""

    @property
    def judged(self) -> CanaryWatch:
        return self.watch if self.watch is not None else CanaryWatch(self.started_at_s, self.from_value,
                                                                     self.to_value)

    def became_ready(self, ready: bool, now_s: float) -> Canary:
        """After a pass that saw the canary pod Ready (or not)."""
        return replace(self, ready_at_s=now_s) if ready and self.ready_at_s is None else self

    def observe(self, canary: WindowFigures | None, others: WindowFigures | None, pods: str) -> Canary:
        """Take this interval's windows of the canary pod and of the others (None: none). A window that overlaps
        the last one taken is skipped (mostly the same requests); one whose pods changed is no evidence."""
        if self.phase != Phase.RUNNING or canary is None:
            return self
        if self.seen_until_s is not None and canary.start_s < self.seen_until_s - 0.1 * canary.seconds:
            return self
        if self.pods and pods != self.pods:
            canary = replace(canary, restarted=True)
        return replace(self, watch=self.judged.observe(canary, others), seen_until_s=canary.end_s, pods=pods)

    def verdict(self, now_s: float) -> Verdict:
        """Promote (Keep), roll back, or wait. No verdict GIVE_UP_SECONDS after the canary pod was first Ready:
        roll back, without a bar (nothing was measured against the value: canary_pass.verified_memory); a pod that
        is never Ready is desired/canary_checks.py's."""
        verdict = self.judged.verdict(now_s)
        if verdict.outcome != Outcome.KEEP or verdict.why != Why.GAVE_UP:
            return verdict
        since = self.ready_at_s
        if since is None or now_s - since < GIVE_UP_SECONDS:
            waited = "it is not Ready yet" if since is None else f"{now_s - since:.0f}s after its pod was Ready"
            return replace(verdict, outcome=Outcome.UNDECIDED, why=Why.TOO_LITTLE_EVIDENCE,
                           message=f"no verdict yet on the canary at {self.to_value}: {waited}")
        return replace(verdict, outcome=Outcome.ROLL_BACK,
                       message=f"no verdict {GIVE_UP_SECONDS:.0f}s after the canary pod was Ready: a canary that "
                               f"cannot be judged is not kept")

    def promoted(self) -> Canary:
        return replace(self, phase=Phase.PROMOTING)


def start(decision: Decision, from_value: int, now_s: float, spare: bool) -> Canary:
    """A canary for ``decision`` (the tuner's change from ``from_value``), started now."""
    return Canary(Phase.RUNNING, from_value, decision.target, now_s, spare, str(decision.reason))


def old_pods(canary: Canary | None, replicas: int) -> int:
    """How many pods the engine's own Deployment runs beside ``canary``: every replica, but one while a canary
    runs (from the start without a spare GPU, once the canary is Ready with one)."""
    if canary is None or canary.phase == Phase.PROMOTING:
        return replicas
    if canary.spare and canary.ready_at_s is None:
        return replicas
    return max(0, replicas - 1)


def canary_pods(canary: Canary | None, others_rolling: bool) -> int:
    """How many pods the canary Deployment runs: one while the canary runs, and while promoted with a spare GPU
    until the others have rolled (without one, its GPU is the one the others' last pod needs)."""
    if canary is None:
        return 0
    if canary.phase == Phase.RUNNING:
        return 1
    return 1 if canary.spare and others_rolling else 0
