"""When a running canary (autotune/canary.py) ends without its verdict: its pod fails, or the canary no longer
applies, or the pods beside it need a protective change now. Pure; desired/canary_pass.py asks before it judges.

Two kinds of end, told apart because only a measured loss bars a direction (docs/live-tuner.md, "Canary
retunes"):

* a rollback (``Why.WORSE``): the canary pod crash-loops at the new value (a larger batch can exhaust GPU memory
  at start-up): the value is what failed;
* an abandonment (``Why.GAVE_UP``, or a reason string): the pod cannot be scheduled or pulled, never becomes
  Ready, or the spec, the engine or the pods beside it moved on: nothing was learnt about the value.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import AutotuneStatus, EngineStatus
from kvpilot.autotune import canary as C
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.reasons import PROTECTIVE_REASONS
from kvpilot.autotune.verify import Outcome, Verdict, Why
from kvpilot.desired.batching import tuning_applies
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.serving import TERMINATION_GRACE_SECONDS
from kvpilot.desired.tuning import tune

CANARY_PREFIX = "tried on one pod first (canary): "  # how history tells a canary's start (canary_pass.py)
# How long a canary pod may wait for a GPU: without a spare one it waits for the old pod it replaces to drain
# (desired/serving.py, TERMINATION_GRACE_SECONDS) and start; past that, something else holds the GPU.
UNSCHEDULABLE_SECONDS = TERMINATION_GRACE_SECONDS + 180
# Waiting reasons that say the value failed (the container started and died), not the cluster.
VALUE_FAILURES = ("CrashLoopBackOff", "Error")
INFRA_FAILURES = ("ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError")


def pod_failed(spec: InferenceEngineSpec, canary: C.Canary, pod: PodState | None, now: datetime) -> Verdict | None:
    """The canary's pod fails: rolled back at once rather than after GIVE_UP_SECONDS, which would hold one old pod
    down for nothing. A crash loop is the value's (barred like a loss); the rest is the cluster's (no bar)."""
    if pod is None:
        return None
    last = f"; last {pod.last_exit[-300:]}" if pod.last_exit else ""
    if pod.waiting_reason in VALUE_FAILURES:
        return Verdict(Outcome.ROLL_BACK, Why.WORSE, f"the canary pod {pod.name} at {canary.to_value} fails: "
                                                     f"{pod.waiting_reason}{last}")
    if pod.waiting_reason in INFRA_FAILURES:
        return Verdict(Outcome.ROLL_BACK, Why.GAVE_UP, f"the canary pod {pod.name} cannot start: "
                                                       f"{pod.waiting_reason} {pod.waiting_message or ''}".strip())
    waited = now.timestamp() - canary.started_at_s
    if pod.unschedulable_message and not pod.ready and waited > UNSCHEDULABLE_SECONDS:
        return Verdict(Outcome.ROLL_BACK, Why.GAVE_UP, f"the canary pod {pod.name} could not be scheduled in "
                       f"{waited:.0f}s: {pod.unschedulable_message[:300]}")
    start_budget = UNSCHEDULABLE_SECONDS + spec.serving.startup_timeout_seconds
    if canary.ready_at_s is None and waited > start_budget:
        return Verdict(Outcome.ROLL_BACK, Why.GAVE_UP, f"the canary pod {pod.name} was not Ready {waited:.0f}s "
                       f"after the canary started (serving.startupTimeoutSeconds and a drain allow {start_budget}s)")
    return None


def no_longer_applies(spec: InferenceEngineSpec, observed: Observed, canary: C.Canary, in_force: int,
                      ceiling: int | None, serving_fp: str | None) -> str | None:
    """Why the canary no longer applies (None: it does). The spec may have moved under it (tuning off, canaries
    off, one replica, several nodes, a new start value, new bounds or a lower ceiling), or a new engine is rolling
    out (its pods no longer run the engine the canary was judged on)."""
    tune = spec.autotune
    if not tuning_applies(spec):
        return "autotune is disabled or in mode Advisory"
    if tune.canary == "Off":
        return "autotune.canary is Off"
    if spec.multinode or spec.serving.replicas < C.MIN_REPLICAS:
        return "the engine no longer runs two or more single-node replicas"
    expected = canary.from_value if canary.phase == C.Phase.RUNNING else canary.to_value
    if in_force != expected:
        return f"the engine's pods now run {in_force} (spec.batching.maxBatchSize or the engine's ceiling moved)"
    if canary.phase == C.Phase.PROMOTING:
        return None
    top = min(tune.max_batch_size, ceiling) if ceiling is not None else tune.max_batch_size
    if not (tune.min_batch_size <= canary.to_value <= top and tune.min_batch_size <= canary.from_value <= top):
        return (f"{canary.from_value} -> {canary.to_value} is outside autotune.minBatchSize {tune.min_batch_size} to "
                f"{top} (autotune.maxBatchSize, or the engine's ceiling)")
    dep = observed.canary_deployment
    if serving_fp and dep is not None and dep.max_batch_size == str(canary.to_value) and dep.fingerprint \
            and dep.fingerprint != serving_fp:
        return f"a new engine ({serving_fp[:10]}) rolls out"
    return None


def _without_canary_start(status: EngineStatus, canary: C.Canary) -> EngineStatus:
    """Status as the old pods know it: the canary's start is history's applied change (so that a promotion keeps
    it and a rollback's record cancels it), but its value was never in force on them, so their guards against
    undoing a recent change must not see it."""
    tune = status.autotune or AutotuneStatus()
    history = tuple(h for h in tune.history or () if not (
        h.applied and h.from_batch_size == canary.from_value and h.to_batch_size == canary.to_value
        and (h.message or "").startswith(CANARY_PREFIX)))
    return replace(status, autotune=replace(tune, history=history))


def old_pods_need(spec: InferenceEngineSpec, observed: Observed, canary: C.Canary, ceiling: int,
                  now: datetime) -> str | None:
    """What the pods beside a running canary need now (None: nothing protective): the tuner's rules on their own
    window, without a simulation. Paused requests, KV pressure or a broken TPOT objective at the old value end the
    canary, so that the next pass can act on every pod (the canary's own misses are its verdict's to judge, so
    only the old pods' window is asked)."""
    w = observed.others_kv
    if w is None or canary.phase != C.Phase.RUNNING:
        return None
    old = replace(spec.serving, replicas=C.old_pods(canary, spec.serving.replicas))
    seen = replace(observed, kv=w, status=_without_canary_start(observed.status, canary))
    decision = tune(replace(spec, serving=old), seen, current=canary.from_value, ceiling=ceiling,
                    rolling=False, building=False, now=now, what_if=WhatIfGate(budget_left=False))
    if decision is None or not decision.changes or decision.reason not in PROTECTIVE_REASONS:
        return None
    return f"the pods at {canary.from_value} need a protective change ({decision.reason}: {decision.message[:300]})"
