"""One reconcile, as a pure function: (InferenceEngine, observed state, now) -> what to apply and report.

The same function serves the operator (each create/update/resume/timer), ``kvpilot render`` (with nothing
observed) and the autotuner benchmark, so what a user reviews is exactly what the operator does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from kvpilot.api.conditions import AVAILABLE, Condition, merge_conditions
from kvpilot.api.models import InferenceEngine, InferenceEngineSpec
from kvpilot.api.timestamps import rfc3339
from kvpilot.api.status import (
    Action,
    AutotuneStatus,
    BatchingStatus,
    BuildState,
    EngineInfo,
    EngineStatus,
    KvCacheStatus,
    ModelStatus,
    VerificationStatus,
    to_wire,
)
from kvpilot.autotune.constants import PLANNING_HORIZON_SECONDS
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.pooling import pooled_traffic
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.trust import MODEL_TRUSTED, model_condition, model_status
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.verification import Memory
from kvpilot.desired.rollout import rolling_update
from kvpilot.desired.tuning import kept_through_shift, last_traffic, traffic_record, tune
from kvpilot.desired import labels as L
from kvpilot.desired import multinode, serving
from kvpilot.desired.batching import BatchingReason, autotune_status, batching_status, tuning_applies, value_in_force
from kvpilot.desired.build_job import build_job
from kvpilot.desired.conditions import compute_conditions
from kvpilot.desired.build import BuildDecision, decide_build, served_engine
from kvpilot.desired.events import Event, events_between
from kvpilot.desired.groups import groups_status
from kvpilot.desired.once import CreateOnce
from kvpilot.desired.observed import DeploymentState, Observed
from kvpilot.desired.pod_parts import image_for
from kvpilot.desired.settings import Settings
from kvpilot.desired.storage import cache_claim, cache_claim_name
from kvpilot.desired.verifying import observed_memory, verification_status
from kvpilot.desired.canary import CanaryRender, CanarySource, idle_value
from kvpilot.desired.canary_pass import (CanaryPass, canary_message, canary_status, judge_canary, start_canary,
                                         verified_memory)
from kvpilot.desired.rollout import surge_pods_in_force
from kvpilot.autotune import canary as C
from kvpilot.api.conditions import PROGRESSING, true
from kvpilot.desired.contract import METRICS_VALID, metrics_condition, release_condition
from kvpilot.trtllm.probe import refusal_in
from kvpilot.trtllm.serve import ServedEngine, serving_surface
from kvpilot.trtllm.surface import Surface


@dataclass(frozen=True)
class Plan:
    apply: list[dict[str, Any]]  # owned children, server-side applied in this order
    build_job: dict[str, Any] | None  # created if absent (shared by engines with the same fingerprint)
    index_entry: tuple[str, str, dict[str, Any]] | None  # (claim, fingerprint, manifest) to record
    status: EngineStatus  # what the plan decided; reconcile serializes it (status_dict) once, when it writes it
    events: list[Event] = field(default_factory=list)
    decision: Decision | None = None
    fingerprint: str = ""
    # The status dict reconcile wrote (status_dict of ``status``, stamped), which the operator's loop keeps as the
    # stored status; None from plan() itself, which writes nothing.
    written: dict[str, Any] | None = None
    # Created when absent and never read back: a multi-node engine's SSH Secret (desired/multinode.py).
    create_once: tuple[CreateOnce, ...] = ()


def _deployment(engine: InferenceEngine, what: _Served, cm: dict[str, Any], batch: int,
                observed: Observed) -> dict[str, Any]:
    """The serving Deployment for ``batch``, from its ConfigMap ``cm`` (rendered once, after the decision)."""
    rollout = engine.spec.serving.rollout
    limits = rolling_update(rollout, observed.surge_room, engine.spec.serving.replicas)
    dep = serving.deployment(engine.meta, engine.spec, what.served, image=what.image, claim=what.claim,
                             max_batch_size=batch, config_map=cm, rolling_update=limits)
    kept = _limits_between_rollouts(rollout.strategy, dep["spec"]["template"], observed.deployment)
    if kept is not None:
        dep["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": kept[0], "maxUnavailable": kept[1]}
    return dep


def _workload(engine: InferenceEngine, what: _Served, cm: dict[str, Any], batch: int, observed: Observed,
              canary: CanaryRender) -> tuple[list[dict[str, Any]], tuple[CreateOnce, ...]]:
    """What serves the engine, with its Service and PodDisruptionBudget: a Deployment (and a canary retune's, where
    one runs or ran), or for a multi-node engine a LeaderWorkerSet of groups with its scripts, and its SSH Secret to
    create once (desired/multinode.py)."""
    meta, spec = engine.meta, engine.spec
    if not spec.multinode:
        pdb = serving.pod_disruption_budget(meta, spec)
        dep = _deployment(engine, what, cm, batch, observed)
        dep["spec"]["replicas"] = canary.old_pods
        extra = canary.render(meta, _canary_source(engine, what, observed), observed.canary_deployment is not None)
        return [dep, *extra, serving.service(meta, spec), *([pdb] if pdb else [])], ()
    rollout = spec.serving.rollout
    limits = rolling_update(rollout, observed.surge_room, spec.serving.replicas)  # in groups (observe/cluster.py)
    dep = serving.deployment(meta, spec, what.served, image=what.image, claim=what.claim, max_batch_size=batch,
                             config_map=cm)
    lws = multinode.leader_worker_set(meta, spec, dep, limits)
    kept = _limits_between_rollouts(rollout.strategy, lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"],
                                    observed.deployment)
    if kept is not None:
        lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"].update(maxSurge=kept[0], maxUnavailable=kept[1])
    children, once = multinode.serving_children(meta, spec, lws)
    idle = canary.render(meta, _canary_source(engine, what, observed), observed.canary_deployment is not None, True)
    return [*children, *idle], once


def _canary_source(engine: InferenceEngine, what: _Served, observed: Observed) -> CanarySource:
    """The engine's ConfigMap and Deployment at a value, for the canary to copy (desired/canary.py)."""
    def at(value: int) -> tuple[dict[str, Any], dict[str, Any]]:
        cm = serving.llm_api_config_map(engine.meta, engine.spec, what.served, value, what.surface)
        return cm, _deployment(engine, what, cm, value, observed)
    return at


def _limits_between_rollouts(strategy: str, template: dict[str, Any],
                             written: DeploymentState | None) -> tuple[int, int] | None:
    """The limits to keep when ``Auto`` would only resize maxSurge (None: write the fresh ones).

    Auto sizes maxSurge by the free GPUs, which other workloads take and release all the time, and which the
    old pods of every rollout hold for a while after it is done. The limits only matter while pods roll, and
    every rollout the operator starts changes the pod template in the same write, so between rollouts a surge
    written is kept: GPUs taken or released alone write nothing, and the next rollout sizes it afresh. Limits
    without surge are not kept, so a Deployment written while free GPUs were unknown (an operator start) or
    none were free surges once some are: at most one such write between two rollouts."""
    if strategy != "Auto" or written is None or written.rolling_update is None:
        return None
    if written.rolling_update[0] < 1 or written.rolling_update[1] != 0:
        return None
    annotations = template["metadata"]["annotations"]  # the pod template (a multi-node group's leader's)
    containers = template["spec"]["containers"]
    same = (written.config_hash == annotations.get(L.CONFIG_HASH_ANNOTATION)
            and written.max_batch_size == annotations.get(L.BATCH_ANNOTATION)
            and written.fingerprint == annotations.get(L.FINGERPRINT_ANNOTATION)
            and written.image == containers[0].get("image"))
    return written.rolling_update if same else None


def _kv_status(observed: Observed, now: datetime, decision: Decision | None) -> KvCacheStatus | None:
    w = observed.kv
    if w is None or w.samples == 0:  # nothing accepted (e.g. every payload rejected): keep what was known
        return observed.status.kv_cache
    seen = pooled_traffic(last_traffic(observed.status, now), w)  # what the what-if replays (tuning.tune)
    traffic = kept_through_shift(observed.status, decision, now) or traffic_record(seen, w.arrival_cv)
    return KvCacheStatus(
        utilization_percent=round(w.peak_utilization * 100),
        used_blocks=w.peak_used_blocks,
        max_blocks=w.max_blocks,
        tokens_per_block=w.tokens_per_block,
        waiting_requests=w.peak_queued,
        active_requests=w.peak_active,
        paused_requests=w.paused,
        traffic=traffic,
        observed_at=rfc3339(now),
    )


@dataclass(frozen=True)
class _Served:
    """What this pass serves, apart from its batch size (the engine, image, claim and release surface)."""

    served: ServedEngine | None
    info: EngineInfo | None  # status.engine
    image: str  # the serving image: the one the engine was built with, when it was built
    claim: str | None
    ceiling: int | None  # the engine's max_batch_size; None: no engine bounds it
    can_serve: bool
    surface: Surface
    known_by: str
    mismatch: str | None


def _what_serves(spec: InferenceEngineSpec, build: BuildDecision, observed: Observed, image: str,
                 claim: str | None) -> _Served:
    served, info = served_engine(spec, build, observed.status, claim)
    recorded_image = info.image if info is not None else None
    serve_image = recorded_image if spec.builds_engine and recorded_image is not None else image
    ceiling = served.max_batch_size if served else (None if not spec.builds_engine else build.ceiling)
    recorded = info.trtllm if info is not None else None
    surface, known_by, mismatch = serving_surface(spec, serve_image, to_wire(recorded) if recorded else None)
    return _Served(served, info, serve_image, claim, ceiling, served is not None or not spec.builds_engine,
                   surface, known_by, mismatch)


@dataclass(frozen=True)
class _InForce:
    """The runtime max_batch_size after this pass's decision, and why (status.batching)."""

    batch: int
    reason: str
    message: str
    decision: Decision | None = None
    applied: bool = False  # the decision is put in force (tuning applies: mode Auto)

    @property
    def moved(self) -> bool:
        return self.applied and self.decision is not None and self.decision.action in (Action.RAISE, Action.LOWER)


def _decided(spec: InferenceEngineSpec, observed: Observed, what: _Served, current: _InForce, *, rolling: bool,
             building: bool, now: datetime, what_if: WhatIfGate, verification: Memory) -> _InForce:
    """The value in force once the tuner has decided (from the value before it, ``current``)."""
    if not what.can_serve:
        return current
    tuner_ceiling = what.ceiling if what.ceiling is not None else spec.autotune.max_batch_size
    decision = tune(spec, observed, current=current.batch, ceiling=tuner_ceiling, rolling=rolling,
                    building=building, now=now, what_if=what_if, verification=verification)
    out = replace(current, decision=decision, applied=bool(decision and decision.changes and tuning_applies(spec)))
    if not out.moved or decision is None:
        return out
    reason = (BatchingReason.AUTOTUNE_ROLLED_BACK if decision.reason == TunerReason.ROLLED_BACK
              else BatchingReason.AUTOTUNE_RAISED if decision.action == Action.RAISE else BatchingReason.AUTOTUNE_LOWERED)
    return replace(out, batch=decision.target, message=decision.message, reason=reason)


def _verified(memory: Memory | None, before: _InForce, after: _InForce, previous: AutotuneStatus | None,
              now: datetime, cpass: CanaryPass) -> VerificationStatus | None:
    """What verification keeps once this pass has decided (None: tuning is off, status.autotune stays). A change
    the canary tries is not in force yet (verification watches it once promoted)."""
    if memory is None:
        return None
    memory = verified_memory(memory, cpass, now)
    rollback = after.decision is not None and after.decision.reason == TunerReason.ROLLED_BACK
    kept = memory.decided(from_value=before.batch, to_value=after.batch, applied=after.moved and not cpass.started,
                          rollback=rollback, now_s=now.timestamp(), horizon_s=PLANNING_HORIZON_SECONDS)
    return verification_status(kept, previous.verification if previous is not None else None)


def _with_canary(spec: InferenceEngineSpec, observed: Observed, judged: CanaryPass, before: _InForce,
                 after: _InForce, now: datetime) -> tuple[CanaryPass, _InForce]:
    """The tuner's change tried on one pod first (the value in force stays), or the canary's promotion put in
    force (autotune/canary.py)."""
    surge = surge_pods_in_force(spec.serving.rollout, observed.surge_room, spec.serving.replicas)
    cpass = start_canary(spec, judged, after.decision, after.moved, before.batch, surge, now,
                         taken=observed.canary_name_taken)
    if cpass.started and after.decision is not None:
        return cpass, replace(before, decision=canary_message(after.decision), applied=True)
    promoted_to = cpass.moves_to()
    if promoted_to is None or cpass.promoted is None:
        return cpass, after
    reason = BatchingReason.AUTOTUNE_RAISED if promoted_to > before.batch else BatchingReason.AUTOTUNE_LOWERED
    return cpass, replace(after, batch=promoted_to, reason=reason,
                          message=f"promoted after its canary: {cpass.promoted.message}")


def plan(engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime, *,
         what_if: WhatIfGate = WhatIfGate()) -> Plan:
    """``what_if``: the tuner's access to its what-if simulation (autotune/gate.py), from the planner
    (kvpilot/planning.py); the default is open (no budget, the model trusted), as for ``kvpilot render``.

    The tuner decides before the serving children are rendered: it needs only whether a rollout is under way,
    which the observed Deployment tells against the ConfigMap of the value in force; the Deployment is then
    rendered once, for the value the decision leaves in force (and the ConfigMap again only if that moved)."""
    spec, meta = engine.spec, engine.meta
    image = image_for(spec, settings.kvsim_image, settings.default_image)
    claim = cache_claim_name(meta, spec)
    claim_obj = cache_claim(meta, spec)
    claim_phase = observed.claim_phase or ("Pending" if claim_obj is not None else None)
    build: BuildDecision = decide_build(spec, observed, image=image, generation=meta.generation, now=now,
                                        claim_exists=claim_phase is not None, claim=claim)
    what = _what_serves(spec, build, observed, image, claim)
    previous_batching = observed.status.batching or BatchingStatus()
    before = _InForce(*value_in_force(spec, previous_batching, what.ceiling))
    obs = replace(observed, claim_phase=claim_phase)

    def config_map(batch: int) -> dict[str, Any]:
        return serving.llm_api_config_map(meta, spec, what.served, batch, what.surface) if what.can_serve else {}

    def conditions(batch: int, cm: dict[str, Any]) -> tuple[list[Condition], bool]:
        return compute_conditions(spec, build, obs, claim=claim, serving_fp=what.served.fingerprint if what.served
                                  else None, has_deployment=what.can_serve, desired_batch=str(batch),
                                  desired_hash=serving.config_hash(cm) if cm else "")

    cm = config_map(before.batch)
    conds, rolling = conditions(before.batch, cm)
    judged = judge_canary(spec, observed, before.batch, rolling, now, what.ceiling,
                          what.served.fingerprint if what.served else None)
    holding = rolling or judged.holds_tuner  # a canary holds the tuner like a rollout
    memory = observed_memory(observed.status, observed, current=before.batch, rolling=holding,
                             expected_pods=spec.serving.replicas, now=now) if spec.autotune.enabled else None
    after = _decided(spec, observed, what, before, rolling=holding, building=build.building, now=now,
                     what_if=what_if, verification=memory or Memory())
    after = replace(after, decision=judged.holding(after.decision))
    cpass, after = _with_canary(spec, observed, judged, before, after, now)
    if after.batch != before.batch:
        cm = config_map(after.batch)
        conds, rolling = conditions(after.batch, cm)
    render = CanaryRender(C.old_pods(cpass.canary, spec.serving.replicas),
                           cpass.canary.to_value if cpass.canary else idle_value(observed, after.batch, what.ceiling),
                           C.canary_pods(cpass.canary, rolling))
    if cpass.canary is not None and cpass.canary.phase == C.Phase.RUNNING:
        running = true(PROGRESSING, "CanaryRunning", f"One pod tries max_batch_size {cpass.canary.to_value} beside "
                       f"the pods at {cpass.canary.from_value}")
        # A build or a missed deadline says more than the canary does.
        conds = [running if c.type == PROGRESSING and c.reason not in ("ProgressDeadlineExceeded", "Building")
                 else c for c in conds]
    workload, once = _workload(engine, what, cm, after.batch, observed, render) if what.can_serve else ([], ())
    apply = [c for c in (claim_obj, cm) if c] + (workload or [serving.service(meta, spec)])
    job = None
    if build.create_job and claim is not None:
        job = build_job(meta, spec, build.fingerprint, image=image, claim=claim, ceiling=build.ceiling,
                        claim_uid=observed.claim_uid)
    index = (claim, build.fingerprint, build.record_in_index) if build.record_in_index and claim else None
    refused = refusal_in(build.status.message) if build.status and build.status.state == BuildState.FAILED else None
    conds = [*conds, release_condition(what.image, what.surface, "refused" if refused else what.known_by,
                                       refused or what.mismatch)]
    metrics = metrics_condition(observed.kv) if spec.autotune.enabled else None
    if metrics is not None:
        conds.append(metrics)
    model = _model_status(spec, observed)
    if model is not None:
        conds.append(model_condition(model))
    status = _status(engine, observed, now, conds, build, what, previous_batching, before, after,
                     _verified(memory, before, after, observed.status.autotune, now, cpass), cpass)
    return Plan(apply, job, index, status, events_between(observed.status, status), after.decision,
                build.fingerprint, create_once=once)


def _status(engine: InferenceEngine, observed: Observed, now: datetime, conds: list[Condition],
            build: BuildDecision, what: _Served, previous_batching: BatchingStatus, before: _InForce,
            after: _InForce, verification: VerificationStatus | None = None,
            cpass: CanaryPass = CanaryPass()) -> EngineStatus:
    spec, meta = engine.spec, engine.meta
    dep_state = observed.deployment
    tuned = autotune_status(observed.status.autotune or AutotuneStatus(), after.decision, current=before.batch,
                            applied=after.applied, now=now, spec_ceiling=spec.build.max_batch_size,
                            verification=verification)
    tuned = canary_status(tuned, cpass, observed, now)  # also ends a canary once tuning is off
    extra = observed.canary_deployment
    return EngineStatus(
        observed_generation=meta.generation,
        conditions=merge_conditions(observed.status.conditions, conds, meta.generation, now,
                                    retired=() if spec.autotune.enabled else (METRICS_VALID, MODEL_TRUSTED)),
        batching=batching_status(spec, previous_batching, value=after.batch, reason=after.reason,
                                 message=after.message, ceiling=what.ceiling, now=now),
        autotune=_with_model(tuned, _model_status(spec, observed)),
        replicas=(dep_state.pods if dep_state else 0) + (extra.pods if extra else 0),
        ready_replicas=(dep_state.ready_replicas if dep_state else 0) + (extra.ready_replicas if extra else 0),
        groups=groups_status(dep_state, list(observed.group_pods), spec.nodes_per_replica, observed.status.groups, now)
        if spec.multinode else None,
        selector=L.selector_string(meta.name),
        endpoint=serving.endpoint(meta, spec),
        engine=what.info,
        build=build.status,
        kv_cache=_kv_status(observed, now, after.decision),
    )


def _model_status(spec: InferenceEngineSpec, observed: Observed) -> ModelStatus | None:
    """status.autotune.model to write (autotune/trust.model_status: the previous one while the figures barely
    move); None without a fit this pass (tuning off, no iterations yet)."""
    if not spec.autotune.enabled or observed.model is None:
        return None
    return model_status((observed.status.autotune or AutotuneStatus()).model, observed.model.status)


def _with_model(tune: AutotuneStatus, model: ModelStatus | None) -> AutotuneStatus:
    return tune if model is None or tune.model == model else replace(tune, model=model)


def requeue_after(engine: InferenceEngine, p: Plan, resync_seconds: float) -> timedelta:
    """Reconcile again soon while something moves, at the tuning interval when tuning, else at resync."""
    progressing, available = p.status.condition("Progressing"), p.status.condition(AVAILABLE)
    # Child events (Jobs, Deployments, pods) wake the loop anyway, and a pass reads only the watch cache;
    # polling only bridges a rollout, so it is slow (why 15 s: docs/live-tuner.md, "How often an engine is
    # planned").
    if progressing is not None and progressing.status == "True" and \
            (available is None or available.reason != "ScaledToZero"):
        return timedelta(seconds=min(resync_seconds, 15))
    if engine.spec.autotune.enabled and p.status.kv_cache is not None:
        # The tuning cadence only once the pods have reported: without a window the tuner holds anyway, and an
        # engine whose pods never serve metrics (kwok, a crash loop) would re-plan every interval for nothing.
        return timedelta(seconds=min(resync_seconds, engine.spec.autotune.interval_seconds))
    return timedelta(seconds=resync_seconds)
