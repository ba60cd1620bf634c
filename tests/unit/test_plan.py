"""Scenario tests of the pure reconcile plan: build, cache, failure, rollout, sharing, conditions, events."""

from __future__ import annotations

from datetime import datetime, timezone

from kvpilot.api.status import parse_status, status_dict
from kvpilot.desired import labels as L
from kvpilot.desired.observed import DeploymentState, JobState, Observed, PodState
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.autotune.whatif import WhatIf
from tests.unit.helpers import engine

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
S = Settings()


def conds(p) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in status_dict(p.status)["conditions"]}


def kinds(p) -> list[str]:
    return [o["kind"] for o in p.apply]


def built(p_first) -> Observed:
    """What the next reconcile sees once the first plan's Job has succeeded."""
    job = JobState(name=p_first.build_job["metadata"]["name"], active=False, succeeded=True, failed=False,
                   completion_time="2026-11-29T12:10:00Z", owner_uids=("uid-1",))
    return Observed(status=p_first.status, claim_phase="Bound", job=job)


def test_new_engine_creates_a_build_job_and_no_deployment() -> None:
    p = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    assert p.build_job is not None and p.build_job["metadata"]["name"] == L.build_job_name(p.fingerprint, "engines")
    assert kinds(p) == ["Service"]
    assert conds(p)["EngineReady"] == ("False", "Building")
    assert conds(p)["Available"] == ("False", "EngineNotReady")
    assert [e.reason for e in p.events] == ["EngineBuildStarted"]


def test_successful_job_records_the_engine_and_rolls_out() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    p = plan(engine(), built(first), S, NOW)
    assert p.index_entry is not None and p.index_entry[1] == first.fingerprint
    assert kinds(p) == ["ConfigMap", "Deployment", "Service"]
    assert status_dict(p.status)["engine"]["fingerprint"] == first.fingerprint
    assert conds(p)["EngineReady"] == ("True", "EngineBuilt")
    assert "EngineBuilt" in [e.reason for e in p.events]
    assert p.build_job is None


def test_engine_in_the_cache_is_not_built_again() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    index = {first.fingerprint: {"fingerprint": first.fingerprint, "maxBatchSize": 512}}
    p = plan(engine(name="other", uid="uid-2"), Observed(claim_phase="Bound", engine_index=index), S, NOW)
    assert p.build_job is None
    assert conds(p)["EngineReady"] == ("True", "CacheHit")


def test_a_hand_edited_index_entry_falls_back_to_the_spec_instead_of_failing_every_pass() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    for bad in ("abc", None, [], True, -3, 2**40, {"x": 1}):
        index = {first.fingerprint: {"fingerprint": first.fingerprint, "maxBatchSize": bad, "maxSeqLen": bad,
                                     "image": bad, "builtAt": bad, "buildJob": bad}}
        p = plan(engine(name="other", uid="uid-2"), Observed(claim_phase="Bound", engine_index=index), S, NOW)
        info = status_dict(p.status)["engine"]
        assert isinstance(info["maxBatchSize"], int) and 0 < info["maxBatchSize"] < 2**31, bad
        assert isinstance(info["image"], str) and info["image"], bad
        assert conds(p)["EngineReady"] == ("True", "CacheHit")


def test_two_engines_with_the_same_build_inputs_share_one_job() -> None:
    a = plan(engine(name="a", uid="ua", batching__maxBatchSize=32), Observed(claim_phase="Bound"), S, NOW)
    b = plan(engine(name="b", uid="ub", serving__replicas=3), Observed(claim_phase="Bound"), S, NOW)
    assert a.build_job["metadata"]["name"] == b.build_job["metadata"]["name"]
    assert a.build_job["metadata"]["ownerReferences"][0]["controller"] is False


def test_serving_only_change_rolls_pods_without_a_build() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    served = plan(engine(), built(first), S, NOW)
    after = Observed(status=served.status, claim_phase="Bound",
                     engine_index={first.fingerprint: served.index_entry[2]})
    p = plan(engine(serving__replicas=3, batching__maxBatchSize=32, generation=2), after, S, NOW)
    assert p.build_job is None and p.fingerprint == first.fingerprint
    dep = next(o for o in p.apply if o["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 3
    assert "32" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_failed_build_keeps_the_last_good_engine_serving() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    good = plan(engine(), built(first), S, NOW)
    changed = engine(build__maxBatchSize=1024, generation=2)
    second = plan(changed, Observed(status=good.status, claim_phase="Bound",
                                    engine_index={first.fingerprint: good.index_entry[2]}), S, NOW)
    assert second.build_job is not None and second.fingerprint != first.fingerprint
    failed_job = JobState(name=second.build_job["metadata"]["name"], active=False, succeeded=False, failed=True,
                          message="RuntimeError: CUDA out of memory")
    dep_state = DeploymentState(1, 1, 1, 1, 1, 1, False, first.fingerprint, "64", None)
    p = plan(changed, Observed(status=second.status, claim_phase="Bound", job=failed_job, deployment=dep_state,
                               engine_index={first.fingerprint: good.index_entry[2]}), S, NOW)
    dep = next(o for o in p.apply if o["kind"] == "Deployment")
    assert dep["spec"]["template"]["metadata"]["annotations"][L.FINGERPRINT_ANNOTATION] == first.fingerprint
    assert status_dict(p.status)["engine"]["fingerprint"] == first.fingerprint
    assert conds(p)["EngineReady"][1] == "BuildFailed"
    assert "CUDA out of memory" in next(c for c in status_dict(p.status)["conditions"] if c["type"] == "EngineReady")["message"]
    assert conds(p)["Degraded"] == ("True", "BuildFailed")
    assert p.build_job is None  # no hot loop: the failed Job is kept and not recreated
    assert "EngineBuildFailed" in [e.reason for e in p.events]


def test_unschedulable_pods_say_why() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    good = plan(engine(), built(first), S, NOW)
    pod = PodState("e1-abc", ready=False, fingerprint=first.fingerprint,
                   unschedulable_message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    dep_state = DeploymentState(1, 1, 1, 1, 0, 0, False, first.fingerprint, "64", None)
    p = plan(engine(), Observed(status=good.status, claim_phase="Bound", deployment=dep_state, pods=(pod,),
                                engine_index={first.fingerprint: good.index_entry[2]}), S, NOW)
    assert conds(p)["Available"] == ("False", "PodsUnschedulable")
    assert conds(p)["Degraded"] == ("True", "InsufficientGPU")


def test_missing_claim_blocks_the_build_with_a_reason() -> None:
    p = plan(engine(), Observed(claim_phase=None), S, NOW)
    assert p.build_job is None
    assert conds(p)["EngineReady"] == ("False", "CacheClaimMissing")


def test_operator_created_claim_is_rendered_and_build_proceeds() -> None:
    p = plan(engine(engineCache={"size": "100Gi", "storageClassName": "fast"}), Observed(), S, NOW)
    claim = next(o for o in p.apply if o["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "e1-engines" and claim["spec"]["storageClassName"] == "fast"
    assert p.build_job is not None


def test_pytorch_serves_without_a_build() -> None:
    # Without an engine cache nothing is prepared (with one, a prepare Job runs: test_build_prepare.py).
    p = plan(engine("pytorch", engineCache=None), Observed(claim_phase="Bound"), S, NOW)
    assert p.build_job is None
    assert kinds(p) == ["ConfigMap", "Deployment", "Service"]
    assert conds(p)["EngineReady"] == ("True", "NoBuildRequired")


def test_status_is_stable_when_nothing_changes() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    good = plan(engine(), built(first), S, NOW)
    dep_state = DeploymentState(1, 1, 1, 1, 1, 1, False, first.fingerprint, "64",
                                None)
    obs = Observed(status=good.status, claim_phase="Bound", deployment=dep_state,
                   engine_index={first.fingerprint: good.index_entry[2]})
    again = plan(engine(), obs, S, NOW)
    later = plan(engine(), Observed(status=again.status, claim_phase="Bound", deployment=dep_state,
                                    engine_index={first.fingerprint: good.index_entry[2]}), S,
                 datetime(2026, 11, 29, 13, 0, tzinfo=timezone.utc))
    assert [c["lastTransitionTime"] for c in status_dict(later.status)["conditions"]] == \
        [c["lastTransitionTime"] for c in status_dict(again.status)["conditions"]]
    assert later.events == []


def test_unschedulable_build_pod_says_why() -> None:
    first = plan(engine(), Observed(claim_phase="Bound"), S, NOW)
    job = JobState(name=first.build_job["metadata"]["name"], active=True, succeeded=False, failed=False,
                   unschedulable_message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    p = plan(engine(), Observed(status=first.status, claim_phase="Bound", job=job), S, NOW)
    assert conds(p)["EngineReady"] == ("False", "BuildUnschedulable")
    assert conds(p)["Degraded"] == ("True", "InsufficientGPU")


def _served(backend_overrides: dict) -> tuple:
    e = engine(**backend_overrides)
    first = plan(e, Observed(claim_phase="Bound"), S, NOW)
    good = plan(e, built(first), S, NOW)
    return e, first, good


def test_a_rebuild_request_raises_the_ceiling_through_a_new_build() -> None:
    tuned = dict(autotune={"mode": "Auto", "allowRebuild": True, "maxBatchSize": 2048})
    e, first, good = _served(tuned)
    status = dict(status_dict(good.status), autotune={"ceilingRequest": 1024, "ceilingRequestFrom": 512})
    p = plan(e, Observed(status=parse_status(status), claim_phase="Bound", engine_index={first.fingerprint: good.index_entry[2]}),
             S, NOW)
    assert p.fingerprint != first.fingerprint and p.build_job is not None
    script = p.build_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "--max_batch_size 1024" in script
    # Until the new engine is published, the old one (ceiling 512) keeps serving.
    assert status_dict(p.status)["engine"]["fingerprint"] == first.fingerprint and status_dict(p.status)["engine"]["maxBatchSize"] == 512


def test_a_new_spec_ceiling_cancels_an_earlier_rebuild_request() -> None:
    tuned = dict(autotune={"mode": "Auto", "allowRebuild": True, "maxBatchSize": 2048})
    e, first, good = _served(tuned)
    status = dict(status_dict(good.status), autotune={"ceilingRequest": 1024, "ceilingRequestFrom": 256})
    p = plan(e, Observed(status=parse_status(status), claim_phase="Bound", engine_index={first.fingerprint: good.index_entry[2]}),
             S, NOW)
    assert p.fingerprint == first.fingerprint and p.build_job is None


def test_a_rebuild_request_is_ignored_unless_rebuilds_are_allowed() -> None:
    e, first, good = _served({})
    status = dict(status_dict(good.status), autotune={"ceilingRequest": 1024})
    p = plan(e, Observed(status=parse_status(status), claim_phase="Bound", engine_index={first.fingerprint: good.index_entry[2]}),
             S, NOW)
    assert p.fingerprint == first.fingerprint and p.build_job is None


def test_a_calibration_claim_is_mounted_for_the_build() -> None:
    e = engine("tensorrt", build__quantization="fp8", build__calibration={"dataset": "pvc://datasets/cnn"})
    job = plan(e, Observed(claim_phase="Bound"), S, NOW).build_job
    pod = job["spec"]["template"]["spec"]
    assert {"name": "calibration", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in pod["volumes"]
    assert {"name": "calibration", "mountPath": "/calibration", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_engines_on_different_claims_build_separately() -> None:
    a = plan(engine(name="a", uid="ua", engineCache={"claimName": "cache-a"}), Observed(claim_phase="Bound"), S, NOW)
    b = plan(engine(name="b", uid="ub", engineCache={"claimName": "cache-b"}), Observed(claim_phase="Bound"), S, NOW)
    assert a.fingerprint == b.fingerprint
    assert a.build_job["metadata"]["name"] != b.build_job["metadata"]["name"]


def test_a_surge_rollout_is_in_progress_until_the_old_pod_is_gone() -> None:
    """maxSurge 1 on one replica: the new pod starts beside the old one, and the counts that a NoSurge rollout
    shows (available < updated) all look settled; the extra pod is what says the rollout goes on. The tuner's
    "no change during a rollout" and Argo CD's Progressing depend on it."""
    from kvpilot.desired.conditions import _rollout_in_progress

    def state(pods: int, updated: int, ready: int, available: int) -> DeploymentState:
        return DeploymentState(generation=2, observed_generation=2, replicas=1, updated_replicas=updated,
                               ready_replicas=ready, available_replicas=available, progress_deadline_exceeded=False,
                               fingerprint="fp", max_batch_size="8", config_hash="h", pods=pods)

    assert _rollout_in_progress(state(pods=2, updated=1, ready=1, available=1), "fp", "8", "h")  # surging
    assert not _rollout_in_progress(state(pods=1, updated=1, ready=1, available=1), "fp", "8", "h")  # done


def test_the_tuning_cadence_starts_once_the_pods_have_reported() -> None:
    """An engine whose pods never report metrics (kwok, a crash loop) re-plans at the resync period, not every
    tuning interval: without a window the tuner holds anyway. Once a window was seen, every interval."""
    from dataclasses import replace

    from kvpilot.api.status import EngineStatus, KvCacheStatus
    from kvpilot.desired.plan import requeue_after

    e = engine()
    assert e.spec.autotune.enabled and e.spec.autotune.interval_seconds < 60
    p = plan(e, Observed(claim_phase="Bound"), S, NOW)
    silent = replace(p, status=EngineStatus())
    reported = replace(p, status=EngineStatus(kv_cache=KvCacheStatus(utilization_percent=40)))
    assert requeue_after(e, silent, 60.0).total_seconds() == 60.0
    assert requeue_after(e, reported, 60.0).total_seconds() == e.spec.autotune.interval_seconds


def test_auto_keeps_the_surge_written_between_rollouts_and_sizes_it_afresh_for_one() -> None:
    """Free GPUs come and go (another team's pods, the old pods of every rollout draining): between rollouts the
    Deployment's limits stay as written (no write); a rollout the operator starts sizes them from the free GPUs."""
    import copy
    from dataclasses import replace

    from kvpilot.desired.observed import deployment_state

    e = engine(serving__replicas=2)
    first = plan(e, Observed(claim_phase="Bound"), S, NOW)
    served = plan(e, built(first), S, NOW)
    (dep,) = [o for o in served.apply if o["kind"] == "Deployment"]
    written = copy.deepcopy(dep)
    written["metadata"]["generation"] = 3
    written["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 2, "maxUnavailable": 0}
    written["status"] = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                         "availableReplicas": 2}
    settled = replace(built(first), status=served.status, deployment=deployment_state(written))

    def limits(p: object) -> dict:
        (d,) = [o for o in p.apply if o["kind"] == "Deployment"]  # type: ignore[attr-defined]
        return d["spec"]["strategy"]["rollingUpdate"]

    for room in (0, 1, 2, None):  # the GPUs others hold change; nothing rolls: the written limits stay
        assert limits(plan(e, replace(settled, surge_room=room), S, NOW)) == {"maxSurge": 2, "maxUnavailable": 0}
    raised = engine(serving__replicas=2, batching__maxBatchSize=128)  # a new limit: the template changes
    assert limits(plan(raised, replace(settled, surge_room=1), S, NOW)) == {"maxSurge": 1, "maxUnavailable": 0}
    assert limits(plan(raised, replace(settled, surge_room=0), S, NOW)) == {"maxSurge": 0, "maxUnavailable": 1}
    # written without surge (free GPUs unknown or none at the time): surging once GPUs are free is worth a write
    no_surge = copy.deepcopy(written)
    no_surge["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 0, "maxUnavailable": 1}
    unsurged = replace(settled, deployment=deployment_state(no_surge), surge_room=2)
    assert limits(plan(e, unsurged, S, NOW)) == {"maxSurge": 2, "maxUnavailable": 0}


def test_when_the_tuner_moves_the_deployment_is_rendered_once_for_the_new_value(monkeypatch) -> None:
    """The decision comes before the serving children: the Deployment is rendered once, for the value the tuner
    puts in force, not first for the old value and again for the new one."""
    from dataclasses import replace

    from kvpilot.autotune import policy
    from kvpilot.autotune.decision import Decision
    from kvpilot.desired import serving
    from tests.unit.test_planning import window

    monkeypatch.setattr(policy, "decide_from_signals", lambda *a: Decision("Raise", 128, "QueueWithHeadroom", "q"))
    monkeypatch.setattr(policy, "what_if_verdict", lambda *a, **_k: WhatIf(128, "confirmed"))
    rendered: list[int] = []
    real = serving.deployment
    monkeypatch.setattr(serving, "deployment", lambda *a, **k: rendered.append(k["max_batch_size"]) or real(*a, **k))
    e = engine(autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 512})
    first = plan(e, Observed(claim_phase="Bound"), S, NOW)
    p = plan(e, replace(built(first), kv=window()), S, NOW)
    assert p.decision is not None and p.decision.action == "Raise"
    assert rendered == [128]
    (dep,) = [o for o in p.apply if o["kind"] == "Deployment"]
    (cm,) = [o for o in p.apply if o["kind"] == "ConfigMap"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations[L.BATCH_ANNOTATION] == "128" and annotations[L.CONFIG_HASH_ANNOTATION] == serving.config_hash(cm)
    assert status_dict(p.status)["batching"]["maxBatchSize"] == 128
