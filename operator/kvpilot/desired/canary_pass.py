"""What a canary retune (autotune/canary.py) does to one plan: judge the one running, start one for the tuner's
decision, and fold the outcome into status. Pure; ``desired/plan.py`` calls it around the tuner's decision.

While a canary runs or is promoted the tuner holds (as during any rollout: RolloutInProgress): the value in force
(status.batching) stays the old pods' until the canary is promoted, so everything that reads it (the rendering
of the engine's own Deployment, verification's baseline, the cooldown) is unchanged by a canary that is rolled
back. The pass that ends a canary decides nothing else: the next one reads the outcome from status.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import Action, AutotuneStatus, DecisionRecord
from kvpilot.api.status_schema import HISTORY_LIMIT
from kvpilot.api.timestamps import rfc3339
from kvpilot.autotune import canary as C
from kvpilot.autotune.constants import PLANNING_HORIZON_SECONDS
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.verification import Memory
from kvpilot.autotune.bars import bar_after_rollback
from kvpilot.autotune.verify import Outcome, Verdict, Why
from kvpilot.desired.canary import canary_figures, canary_of, canary_pod, canary_record
from kvpilot.desired.canary_checks import CANARY_PREFIX, no_longer_applies, old_pods_need, pod_failed
from kvpilot.desired.observed import Observed
from kvpilot.desired.verifying import pods_digest


@dataclass(frozen=True)
class CanaryPass:
    """The canary after this pass's judgement: the one still running (or promoting), and what this pass ended."""

    canary: C.Canary | None = None
    promoted: Verdict | None = None  # this pass promotes it: the value moves to canary.to_value
    rolled_back: Verdict | None = None  # this pass rolls it back
    ended: C.Canary | None = None  # the canary this pass rolled back, abandoned or saw promoted everywhere
    started: bool = False  # this pass started ``canary`` for the tuner's decision
    abandoned: str | None = None  # why this pass ended a running canary without a verdict on its value

    @property
    def holds_tuner(self) -> bool:
        """Whether the tuner holds this pass: a canary runs, or this pass ended one."""
        return self.canary is not None or self.ended is not None

    def holding(self, decision: Decision | None) -> Decision | None:
        """The tuner's hold while a canary runs, saying so (the rule's message names any rollout)."""
        c = self.canary
        if c is None or decision is None or decision.reason != TunerReason.ROLLOUT_IN_PROGRESS:
            return decision
        what = "is judged against the other pods" if c.phase == C.Phase.RUNNING else "is promoted to every pod"
        return replace(decision, message=f"a canary at {c.to_value} {what}; observing only")

    def moves_to(self) -> int | None:
        """The value this pass puts in force on the engine's own pods (promotion), None when it keeps it."""
        return self.canary.to_value if self.promoted is not None and self.canary is not None else None


def judge_canary(spec: InferenceEngineSpec, observed: Observed, in_force: int, old_rolling: bool, now: datetime,
                 ceiling: int | None = None, serving_fp: str | None = None) -> CanaryPass:
    """The canary status holds, judged on this interval's windows. ``in_force``: the value status holds for the
    engine's own pods; ``old_rolling``: whether they are rolling (their template, or their count); ``ceiling``:
    the engine's; ``serving_fp``: the engine the pods serve. A canary that no longer applies is abandoned
    (desired/canary_checks.py)."""
    canary = canary_of(observed.status.autotune, now)
    if canary is None:
        return CanaryPass()
    why = no_longer_applies(spec, observed, canary, in_force, ceiling, serving_fp)
    if why is not None or canary.phase == C.Phase.PROMOTING:
        if why is None and old_rolling:
            return CanaryPass(canary)
        return CanaryPass(ended=canary, abandoned=why if canary.phase == C.Phase.RUNNING else None)
    pod = canary_pod(observed)
    canary = canary.became_ready(pod is not None and pod.ready, now.timestamp())
    need = old_pods_need(spec, observed, canary, ceiling or spec.autotune.max_batch_size, now)
    if need is not None:
        return CanaryPass(ended=canary, abandoned=need)
    old_pods = C.old_pods(canary, spec.serving.replicas)
    figures = canary_figures(observed, old_pods, now)
    canary = canary.observe(*figures, pods_digest(observed))
    verdict = pod_failed(spec, canary, pod, now) or canary.verdict(now.timestamp())
    if verdict.outcome == Outcome.KEEP:
        return CanaryPass(canary.promoted(), promoted=verdict)
    if verdict.outcome == Outcome.ROLL_BACK:
        return CanaryPass(rolled_back=verdict, ended=canary)
    return CanaryPass(canary)


def start_canary(spec: InferenceEngineSpec, judged: CanaryPass, decision: Decision | None, applied: bool,
                 in_force: int, surge: int, now: datetime, taken: bool = False) -> CanaryPass:
    """A canary for the tuner's ``decision`` when it applies one that is tried on one pod first
    (``canary.wants_canary``, where ``autotune.canary`` asks for one: see ``canary_wanted``); else the pass as
    judged. ``surge``: the pods the rollout in force starts ahead of the old ones; ``taken``: the canary
    Deployment's name is held by an object the engine does not control (the change then goes to every pod)."""
    if judged.holds_tuner or not applied or decision is None or taken or not C.wants_canary(
            decision, spec.serving.replicas, spec.multinode, canary_wanted(spec, surge)):
        return judged
    return CanaryPass(C.start(decision, in_force, now.timestamp(), surge > 0), started=True)


def canary_wanted(spec: InferenceEngineSpec, surge: int) -> bool:
    """``autotune.canary``: Off (the default); Always; Auto, where the rollout cannot restart every pod at once (no
    free GPU for each: a surge of fewer pods than replicas, or none).

    Why Auto stops there (docs/live-tuner.md, "Canary retunes"): with a free GPU for every pod, a rollout restarts
    them all in one start-to-Ready time without dropping capacity, and verification catches a harmful change about
    as soon as a canary would (the benchmark's forced bad change: 30 s later); a canary then only holds every other
    pod at the old value while it is judged (about four minutes), which cost the changes the suite makes for a gain
    up to 9% of a run's goodput (phase-shift-l40s from 64: 16.42 req/s against 18.08). Why Off by default: without
    a spare GPU too, every canary in the suite was a gain, promoted minutes late (49 of 50 canaries over 40 rows,
    the 50th still judged when its run ended; none rolled back), at up to 15% of a run's goodput."""
    mode = spec.autotune.canary
    return mode == "Always" or (mode == "Auto" and surge < spec.serving.replicas)


def verified_memory(memory: Memory, cpass: CanaryPass, now: datetime) -> Memory:
    """Verification's memory once the canary has acted: a promoted change is watched like any applied one (on
    every pod, against the baseline at the old value); a rolled-back canary bars the direction that failed, at
    the load measured at the old value, as a rollback does."""
    ended = cpass.ended
    if cpass.promoted is not None and cpass.canary is not None:
        c = cpass.canary
        return memory.decided(from_value=c.from_value, to_value=c.to_value, applied=True, rollback=False,
                              now_s=now.timestamp(), horizon_s=PLANNING_HORIZON_SECONDS)
    if cpass.rolled_back is not None and cpass.rolled_back.why == Why.WORSE and ended is not None:
        side = memory.baseline.side if memory.baseline.limit == ended.from_value else None
        bar = bar_after_rollback(ended.from_value, ended.to_value, now.timestamp(), PLANNING_HORIZON_SECONDS,
                                 memory.bars, side)
        return replace(memory, bars=(*memory.bars, bar)[-8:])
    return memory


def canary_status(tune: AutotuneStatus, cpass: CanaryPass, observed: Observed, now: datetime) -> AutotuneStatus:
    """status.autotune with the canary folded in: its record; a rolled-back canary's history record (the pair of
    it and the change it undid leaves the tuner's anti-oscillation memory, as a rollback's does); the cooldown
    counted from a promotion."""
    pod = canary_pod(observed)
    ending: tuple[C.Canary, C.Ending, str, float] | None = None
    if cpass.promoted is not None and cpass.canary is not None:
        ending = (cpass.canary, C.Ending.PROMOTED, f"promoted: {cpass.promoted.message}", now.timestamp())
    elif cpass.rolled_back is not None and cpass.ended is not None:
        ending = (cpass.ended, C.Ending.ROLLED_BACK, f"rolled back: {cpass.rolled_back.message}", now.timestamp())
    elif cpass.abandoned is not None and cpass.ended is not None:
        ending = (cpass.ended, C.Ending.ABANDONED, f"abandoned: {cpass.abandoned}", now.timestamp())
    out = replace(tune, canary=canary_record(cpass.canary, tune.canary, pod.name if pod else None, ending))
    if cpass.promoted is not None:
        out = replace(out, last_applied_at=rfc3339(now), what_if_declined_at=None)
    ended = cpass.ended
    undone = (f"canary rolled back: {cpass.rolled_back.message}" if cpass.rolled_back is not None
              else f"canary abandoned: {cpass.abandoned}" if cpass.abandoned is not None else None)
    if undone is not None and ended is not None:
        # The pod that ran the canary's value goes back to the old one: a rollback's record, so that it and the
        # canary's start leave the anti-oscillation memory together (desired/tuning.recent_changes).
        record = DecisionRecord(at=rfc3339(now), action=Action.LOWER if ended.to_value > ended.from_value
                                else Action.RAISE, from_batch_size=ended.to_value, to_batch_size=ended.from_value,
                                reason=TunerReason.ROLLED_BACK, message=undone[:1024], applied=True)
        out = replace(out, history=(record, *(out.history or ()))[:HISTORY_LIMIT])
    return out


def canary_message(decision: Decision) -> Decision:
    """The tuner's decision as the canary tries it (status.autotune.history says it went to one pod first)."""
    return replace(decision, message=f"{CANARY_PREFIX}{decision.message}")
