"""The autotuner's decision within one plan: what status and the observed state say, as the tuner's input.

``tune`` translates (the value in force, its ceiling, the rollout and build state, status.autotune's memory,
what a restart and a build have been measured to cost, the what-if gate with the served engine's model bound)
and asks ``autotune.policy.decide``; ``desired/batching.py`` then folds the decision into status.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import Action, AutotuneStatus, BuildState, DecisionRecord, EngineStatus, TrafficStatus
from kvpilot.api.timestamps import parse_rfc3339
from kvpilot.autotune.capped import OUTPUT_SIGMA, cap_from_length_share
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import WhatIfGate, engine_model
from kvpilot.autotune.inputs import AppliedChange, ChangeCost, TunerHistory, TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.shift import SeenTraffic
from kvpilot.autotune.verification import Memory
from kvpilot.autotune.whatif import Engine as WhatIfEngine
from kvpilot.desired.observed import Observed
from kvpilot.desired.rollout import surge_pods_in_force
from kvpilot.trtllm.cuda_graphs import graph_token_cap

DEFAULT_RESTART_SECONDS = 120.0  # until a pod restart has been measured
# A multi-node engine restarts a whole group: every pod starts, the leader waits for its workers, every rank loads
# its shard. An assumption (no real multi-node start could be measured): twice a pod's, until a group is measured.
DEFAULT_GROUP_RESTART_SECONDS = 2 * DEFAULT_RESTART_SECONDS


def restart_seconds(spec: InferenceEngineSpec, observed: Observed) -> float:
    """What one restart costs: the measured start-to-Ready of a serving pod (a multi-node group's leader, which
    is Ready only when its whole group serves), else the assumption for the engine's shape."""
    return observed.startup_seconds or (DEFAULT_GROUP_RESTART_SECONDS if spec.multinode else DEFAULT_RESTART_SECONDS)
DEFAULT_BUILD_SECONDS = 1200.0  # until a build has been measured


def when(value: str | None, now: datetime) -> datetime | None:
    """A status timestamp in ``now``'s zone; None when absent or not RFC 3339 (status is user-writable)."""
    try:
        return parse_rfc3339(value, now.tzinfo) if value else None
    except ValueError:
        return None


def last_build_seconds(status: EngineStatus, now: datetime) -> float | None:
    """Duration of the last finished build (status.build), the rebuild cost the tuner weighs."""
    build = status.build
    if build is None or build.state != BuildState.SUCCEEDED:
        return None
    start, end = when(build.started_at, now), when(build.finished_at, now)
    return max(0.0, (end - start).total_seconds()) if start and end else None


def tune(
    spec: InferenceEngineSpec, observed: Observed, *, current: int, ceiling: int, rolling: bool, building: bool,
    now: datetime, what_if: WhatIfGate, verification: Memory = Memory(),
) -> Decision | None:
    """The tuner's decision for this pass; None when tuning is off. ``what_if``: the planner's gate, to which
    the served engine's model is bound here; ``verification``: what verification keeps, with this pass's window
    taken in (desired/verifying.observed_memory)."""
    if not spec.autotune.enabled:
        return None
    replicas = spec.serving.replicas
    surge = surge_pods_in_force(spec.serving.rollout, observed.surge_room, replicas)
    return decide(
        TunerInput(
            current=current,
            ceiling=ceiling,
            spec=spec.autotune,
            window=observed.kv,
            scheduler_policy=spec.batching.scheduler_policy,
            rollout_in_progress=rolling,
            build_in_progress=building,
            now=now,
            expected_pods=replicas,
            cost=ChangeCost(
                replicas=replicas,
                restart_seconds=restart_seconds(spec, observed),
                build_seconds=last_build_seconds(observed.status, now) or DEFAULT_BUILD_SECONDS,
                surge=surge > 0,
                graph_max_num_tokens=graph_token_cap(spec),
            ),
            history=TunerHistory(
                last_applied_at=when((observed.status.autotune or AutotuneStatus()).last_applied_at, now),
                recent_changes=recent_changes(observed.status, now),
                declined_since=declined_since(observed.status.autotune, now),
                verification=verification,
                last_traffic=last_traffic(observed.status, now),
                shifting_since=shifting_since(observed.status.autotune, now),
            ),
            what_if=replace(what_if, model=what_if_model(spec, ceiling, observed)),
        )
    )


def what_if_model(spec: InferenceEngineSpec, ceiling: int, observed: Observed) -> WhatIfEngine | None:
    """The kvsim model of the served engine at ``ceiling``, with the restart cost and rollout observed, calibrated
    to the pods where the tuner has fitted them (``observed.model``)."""
    surge = surge_pods_in_force(spec.serving.rollout, observed.surge_room, spec.serving.replicas)
    return engine_model(spec, ceiling, restart_seconds=restart_seconds(spec, observed),
                        surge_pods=surge, model=observed.model)


def last_traffic(status: EngineStatus, now: datetime) -> SeenTraffic | None:
    """The traffic the last pass recorded (status.kvCache.traffic), with its age (from
    status.kvCache.observedAt; unknown when unreadable or in the future); None when absent or unusable."""
    kv = status.kv_cache
    if kv is None or kv.traffic is None:
        return None
    seen = when(kv.observed_at, now)
    age = (now - seen).total_seconds() if seen is not None and seen <= now else None
    t = kv.traffic
    return SeenTraffic.from_status(t.requests_per_minute, t.prompt_tokens, t.output_tokens, age, t.requests,
                                   t.stopped_at_max_tokens)


def kept_through_shift(status: EngineStatus, decision: Decision | None, now: datetime) -> TrafficStatus | None:
    """The traffic record to keep for the next pass while the tuner holds a TPOT lower for a shifting mix
    (``Decision.keeps_traffic``): the one from before the shift, so the pass that ends the wait still measures the
    whole move (autotune/shift.py), and the lower is sized on the traffic ahead (autotune/ahead.py). Rewritten
    window by window, the record moved with the lagging lengths: on chat then document Q&A (chat-then-rag-a100,
    no spare GPU, from 64), the wait's window read prompts 286 -> 718 tokens and the next one about 790, too
    little a move to read, so the lower after the wait was sized on those prompts (to 119) where documents are
    2,000, and a second rolling restart followed (docs/tuner-suite.md, "Twenty-sixth pass"). A raise's wait
    rewrites the record as before: the windows it waits through pool into the traffic the raise is sized on
    (autotune/pooling.py). None: write this pass's record. Also None where a wait is in force whose start cannot
    be read (status.autotune.recommendation.at unreadable or in the future): the wait's limit (``shift.mix_wait``)
    counts from that start, and against a record kept the lengths would read as moving for as long as the new
    traffic lasts; a record that moves on ends the wait once the lengths settle, as before."""
    kv = status.kv_cache
    if decision is None or not decision.keeps_traffic or kv is None:
        return None
    if _shift_hold(status.autotune) is not None and shifting_since(status.autotune, now) is None:
        return None
    return kv.traffic


def traffic_record(seen: SeenTraffic | None, arrival_cv: float | None) -> TrafficStatus | None:
    """status.kvCache.traffic for the next pass (``last_traffic`` reads it back): the traffic the what-if replays
    at this one, and the cap it places from the share of requests that stopped at their max_tokens."""
    if seen is None:
        return None
    share = seen.length_share
    cap = cap_from_length_share(seen.output_mean, share, OUTPUT_SIGMA)
    return TrafficStatus(requests_per_minute=round(seen.rate_per_pod * 60), prompt_tokens=round(seen.prompt_mean),
                         output_tokens=round(seen.output_mean),
                         arrival_cv=f"{arrival_cv:.2f}" if arrival_cv is not None else None,
                         requests=round(seen.requests),
                         stopped_at_max_tokens=f"{share:.6f}" if share is not None else None, max_tokens=cap or None)


def shifting_since(tune: AutotuneStatus | None, now: datetime) -> datetime | None:
    """When the run of TrafficShifting holds in force began: the recommendation's time, refreshed only when the
    advice changes (desired/batching.autotune_status). None when the tuner is not holding for a shifting mix."""
    rec = _shift_hold(tune)
    if rec is None:
        return None
    at = when(rec.at, now)
    return at if at is not None and at <= now else None


def _shift_hold(tune: AutotuneStatus | None) -> DecisionRecord | None:
    """The recommendation in force when it is a TrafficShifting hold (the tuner waiting out a shifting mix)."""
    rec = tune.recommendation if tune is not None else None
    if rec is None or rec.action != Action.HOLD or rec.reason != TunerReason.TRAFFIC_SHIFTING:
        return None
    return rec


def declined_since(tune: AutotuneStatus | None, now: datetime) -> datetime | None:
    """When the what-if simulation last ran and declined (status.autotune.whatIfDeclinedAt); None when it has
    not since the last applied change, or the value is unreadable."""
    return when(tune.what_if_declined_at, now) if tune is not None else None


def recent_changes(status: EngineStatus, now: datetime) -> tuple[AppliedChange, ...]:
    """Applied Raise/Lower records of status.autotune.history, newest first (the tuner's anti-oscillation memory).

    A rollback and the change it undid are left out together: the pair cancels out, so it is no A->B->A and
    takes nothing from the reversal budget (issue 18); the direction that failed is barred instead
    (status.autotune.verification.bars)."""
    out: list[AppliedChange] = []
    undone: tuple[int, int] | None = None  # (from, to) of the change the newer rollback undid
    for record in (status.autotune or AutotuneStatus()).history or ():
        if not record.applied or record.action not in (Action.RAISE, Action.LOWER):
            continue
        at = when(record.at, now)
        if at is None or record.from_batch_size is None or record.to_batch_size is None:
            continue  # a hand-edited or older record: ignored, not fatal
        if record.reason == TunerReason.ROLLED_BACK:
            undone = (record.to_batch_size, record.from_batch_size)
            continue
        if undone == (record.from_batch_size, record.to_batch_size):
            undone = None
            continue
        out.append(AppliedChange(at, record.from_batch_size, record.to_batch_size))
    return tuple(out)
