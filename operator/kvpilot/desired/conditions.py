"""Computes the four standard conditions from what was decided and observed (the other two, ReleaseContract
and MetricsValid, are desired/contract.py's).

EngineReady: the engine the spec asks for is published. Available: at least one pod serves (possibly the
previous engine). Progressing: a build or a rollout is under way. Degraded: something needs a person — a
failed build, pods that cannot be scheduled, pods crash-looping, a missing cache claim.
"""

from __future__ import annotations

from kvpilot.api.conditions import (
    AVAILABLE,
    DEGRADED,
    ENGINE_READY,
    PROGRESSING,
    Condition,
    ConditionReason,
    false,
    true,
)
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import BuildState, BuildStatus
from kvpilot.desired.build import RETRY_HINT, BuildDecision
from kvpilot.desired.observed import DeploymentState, Observed
from kvpilot.desired.redact import redact

CRASH_REASONS = ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "Error")


def engine_ready(
    spec: InferenceEngineSpec, build: BuildDecision, *, claim: str | None, claim_phase: str | None,
    unschedulable_build: str | None = None,
) -> Condition:
    if not spec.builds_engine:
        return true(ENGINE_READY, "NoBuildRequired", "The pytorch backend serves the checkpoint directly")
    if build.ready is not None:
        cache_hit = build.status is not None and build.status.state == BuildState.CACHE_HIT
        reason: ConditionReason = "CacheHit" if cache_hit else "EngineBuilt"
        return true(ENGINE_READY, reason, f"Engine {build.fingerprint[:10]} is published on claim {claim}")
    if claim_phase is None:
        return false(ENGINE_READY, "CacheClaimMissing", f"PersistentVolumeClaim {claim} (spec.engineCache) was not found")
    st = build.status or BuildStatus()
    if st.state == BuildState.FAILED:
        return false(ENGINE_READY, "BuildFailed", f"Job {st.job} failed: {st.message or 'no message'}. {RETRY_HINT}")
    if unschedulable_build:
        return false(ENGINE_READY, "BuildUnschedulable",
                     f"The build pod of Job {st.job} cannot be scheduled: {unschedulable_build}")
    return false(ENGINE_READY, "Building", f"Job {st.job} is building engine {build.fingerprint[:10]}")


def _rollout_in_progress(dep: DeploymentState | None, desired_fp: str | None, desired_batch: str, desired_hash: str) -> bool:
    if dep is None:
        return False
    stale_template = (
        (desired_fp is not None and dep.fingerprint != desired_fp)
        or dep.max_batch_size != desired_batch
        or dep.config_hash != desired_hash
    )
    return (
        stale_template
        or dep.observed_generation < dep.generation
        or dep.updated_replicas < dep.replicas
        # A surge rollout: the new pod is not ready yet while the old one still serves (pods 2, updated 1,
        # available 1), so only the pod count tells (kubectl rollout status: "old replicas are pending termination").
        or dep.pods > dep.updated_replicas
        or dep.available_replicas < dep.updated_replicas
        or dep.ready_replicas < dep.replicas
    )


def compute_conditions(
    spec: InferenceEngineSpec,
    build: BuildDecision,
    observed: Observed,
    *,
    claim: str | None,
    serving_fp: str | None,
    has_deployment: bool,
    desired_batch: str,
    desired_hash: str,
) -> tuple[list[Condition], bool]:
    """The conditions and whether a rollout is in progress (the tuner holds while one is)."""
    job = observed.job
    ready = engine_ready(spec, build, claim=claim, claim_phase=observed.claim_phase,
                         unschedulable_build=job.unschedulable_message if job is not None and job.active else None)
    dep = observed.deployment
    rolling = has_deployment and _rollout_in_progress(dep, serving_fp if spec.builds_engine else None,
                                                      desired_batch, desired_hash)
    available = _available(spec, build, observed, has_deployment)
    progressing = _progressing(build, ready, dep, rolling)
    return [ready, available, progressing, _degraded(ready, available, observed, claim)], rolling


def _available(spec: InferenceEngineSpec, build: BuildDecision, observed: Observed, has_deployment: bool) -> Condition:
    """At least one pod serves (possibly the previous engine's)."""
    dep = observed.deployment
    unschedulable = [p for p in observed.pods if not p.deleting and p.unschedulable_message]
    # A canary retune's pod serves behind the same Service as the engine's own (autotune/canary.py).
    canary = observed.canary_deployment
    available_replicas = (dep.available_replicas if dep else 0) + (canary.available_replicas if canary else 0)
    if spec.serving.replicas == 0:
        return false(AVAILABLE, "ScaledToZero", "spec.serving.replicas is 0")
    if not has_deployment:
        return false(AVAILABLE, "EngineNotReady", "No engine is ready to serve yet")
    if available_replicas > 0:
        note = " (previous engine; the new one is still building)" if build.building else ""
        return true(AVAILABLE, "MinimumReplicasAvailable", f"{available_replicas}/{spec.serving.replicas} pods serve{note}")
    if unschedulable:
        return false(AVAILABLE, "PodsUnschedulable", unschedulable[0].unschedulable_message or "")
    return false(AVAILABLE, "PodsNotReady", "No serving pod is ready yet")


def _progressing(build: BuildDecision, ready: Condition, dep: DeploymentState | None, rolling: bool) -> Condition:
    """A build or a rollout is under way."""
    if build.building:
        return true(PROGRESSING, "Building", ready.message)
    if rolling:
        return true(PROGRESSING, "RollingOut", "Serving pods are being replaced")
    if dep is not None and dep.progress_deadline_exceeded:
        return false(PROGRESSING, "ProgressDeadlineExceeded", "The rollout did not finish in time")
    return false(PROGRESSING, "Settled", "Nothing to build or roll out")


def _degraded(ready: Condition, available: Condition, observed: Observed, claim: str | None = None) -> Condition:
    """Something needs a person: a failed build, a missing or terminating claim, pods (or the build pod) that
    cannot be scheduled, pods that crash, pods that are not the engine's but wear its labels."""
    job = observed.job
    pods = [p for p in (*observed.pods, *observed.workers) if not p.deleting]  # a multi-node group's workers too
    unschedulable = [p for p in pods if p.unschedulable_message]
    crashing = [p for p in pods if p.waiting_reason in CRASH_REASONS]
    waiting_pod = unschedulable[0] if unschedulable else None
    waiting_msg = waiting_pod.unschedulable_message if waiting_pod else (
        job.unschedulable_message if ready.reason == "BuildUnschedulable" and job is not None else None)
    if ready.reason == "BuildFailed":
        serving = " The previous engine keeps serving." if available.status == "True" else ""
        return true(DEGRADED, "BuildFailed", ready.message + serving)
    if ready.reason == "CacheClaimMissing":
        return true(DEGRADED, "CacheClaimMissing", ready.message)
    if observed.claim_terminating:
        return true(DEGRADED, "CacheClaimTerminating", f"PersistentVolumeClaim {claim}: {CLAIM_TERMINATING}")
    if waiting_msg:
        reason: ConditionReason = "InsufficientGPU" if "nvidia.com/gpu" in waiting_msg else "PodsUnschedulable"
        who = f"Pod {waiting_pod.name}" if waiting_pod else "The build pod"
        return true(DEGRADED, reason, f"{who} cannot be scheduled: {waiting_msg}")
    if crashing:
        p = crashing[0]
        waiting = f"Pod {p.name}: {p.waiting_reason} {p.waiting_message or ''}".strip()
        # The termination message holds the cause ("CrashLoopBackOff back-off 40s" does not): its tail, redacted.
        last = f"; last {p.last_exit[-CRASH_MESSAGE_CHARS:]}" if p.last_exit else ""
        return true(DEGRADED, "PodsFailing", redact(waiting + last))
    if observed.foreign_pods:
        return true(DEGRADED, "ForeignPods", foreign_pods_message(observed.foreign_pods))
    return false(DEGRADED, "AsExpected", "No problem observed")


CRASH_MESSAGE_CHARS = 1024
CLAIM_TERMINATING = ("the cache claim is being deleted: it stays only while pods mount it, and every engine on it "
                     "goes with it; no build starts on it. Re-create it (or name another claim in "
                     "spec.engineCache) once it is gone")
FOREIGN_SHOWN = 5


def foreign_pods_message(names: tuple[str, ...]) -> str:
    """Pods with the engine's labels that its workload did not create: named (the first few), and what that means."""
    shown = ", ".join(names[:FOREIGN_SHOWN]) + (f" and {len(names) - FOREIGN_SHOWN} more" if len(names) > FOREIGN_SHOWN
                                                 else "")
    return (f"Ignored {len(names)} pod(s) with this engine's labels that its Deployment did not create: {shown}. "
            "Their metrics feed no decision; the engine's Service selects them too: delete or relabel them")
