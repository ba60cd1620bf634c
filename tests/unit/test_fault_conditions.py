"""What status says of the smaller faults of issue 22: a crash loop carries the container's termination message
(redacted), a cache claim being deleted is said so (and starts no build), and a failed build says how to build it
again; the retry it names (annotation serving.kvpilot.io/retry-build, a time) builds once more under a Job of its
own name, and only for a failure before that time."""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timedelta, timezone
from typing import Any

from kvpilot.api.status import BuildState
from kvpilot.desired.build import RETRY_ANNOTATION, decide_build, retry_job_name
from kvpilot.desired.observed import JobState, Observed, PodState, pod_state
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.reconcile import reconcile
from tests.unit.helpers import engine
from tests.unit.test_reconcile_cache import S, FakeApi, claim

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def crash_looping_pod(message: str) -> dict[str, Any]:
    return {"metadata": {"name": "e1-abc"}, "status": {"containerStatuses": [{
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
    }]}}


def test_a_crash_loop_condition_carries_the_termination_message_redacted() -> None:
    tail = "RuntimeError: CUDA out of memory. HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 was set"
    observed = Observed(pods=(pod_state(crash_looping_pod(tail)),), claim_phase="Bound")
    degraded = plan(engine(), observed, Settings(), NOW).status.condition("Degraded")
    assert degraded is not None and degraded.reason == "PodsFailing"
    assert "CrashLoopBackOff" in degraded.message and "exit code 1 (Error)" in degraded.message
    assert "CUDA out of memory" in degraded.message and "hf_abcdefghijklmnopqrstuvwxyz" not in degraded.message


def test_a_terminating_cache_claim_is_said_so_and_starts_no_build() -> None:
    observed = Observed(claim_phase="Bound", claim_uid="claim-1", claim_terminating=True)
    p = plan(engine(), observed, Settings(), NOW)
    degraded = p.status.condition("Degraded")
    assert degraded is not None and degraded.reason == "CacheClaimTerminating" and "engines" in degraded.message
    assert p.build_job is None


def failed_job(name: str = "kvpilot-build-x", at: datetime = NOW - timedelta(hours=1)) -> JobState:
    return JobState(name=name, active=False, succeeded=False, failed=True, message="nvcc: out of memory",
                    failed_at=at.strftime("%Y-%m-%dT%H:%M:%SZ"))


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_failed_build_names_its_retry_and_a_request_after_the_failure_builds_once_more() -> None:
    e = engine()
    observed = Observed(claim_phase="Bound", claim_uid="c1", job=failed_job())
    ready = plan(e, observed, Settings(), NOW).status.condition("EngineReady")
    assert ready is not None and ready.reason == "BuildFailed" and RETRY_ANNOTATION in ready.message
    asked = stamp(NOW - timedelta(minutes=1))
    d = decide_build(e.spec, Observed(claim_phase="Bound", claim_uid="c1", job=failed_job(), retry_build=asked),
                     image="img", generation=1, now=NOW, claim="engines")
    assert d.create_job and d.status is not None and d.status.state == BuildState.BUILDING
    assert d.status.job == retry_job_name("kvpilot-build-x", asked)


def test_no_retry_for_a_failure_after_the_request_for_a_request_ahead_of_time_or_not_a_time() -> None:
    e = engine()
    for request in (stamp(NOW - timedelta(hours=2)), stamp(NOW + timedelta(hours=1)), "yes please", ""):
        d = decide_build(e.spec, Observed(claim_phase="Bound", claim_uid="c1", job=failed_job(),
                                          retry_build=request), image="img", generation=1, now=NOW, claim="engines")
        assert not d.create_job and d.status is not None and d.status.state == BuildState.FAILED, request


def test_the_retry_job_is_created_under_its_own_name_and_then_stands_for_the_failed_one() -> None:
    api = FakeApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    first, _ = asyncio.run(reconcile(api, engine(), {}, S, None, NOW, writer=api.writer))
    status = first.written or {}
    failed = copy.deepcopy(api.cache.get("Job", "ns", status["build"]["job"]))
    failed["metadata"]["resourceVersion"] = "900"
    failed["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                        "lastTransitionTime": stamp(NOW - timedelta(minutes=5))}]}
    api.cache.upsert("Job", failed)
    asked = stamp(NOW - timedelta(minutes=1))
    e = engine()
    e.meta.annotations[RETRY_ANNOTATION] = asked
    status = (asyncio.run(reconcile(api, e, status, S, None, NOW, writer=api.writer))[0].written or {})
    retry = retry_job_name(failed["metadata"]["name"], asked)
    assert status["build"] == {**status["build"], "job": retry, "state": "Building"}
    assert ("create", "Job", retry) in api.writes and api.cache.get("Job", "ns", retry) is not None
    api.writes.clear()
    status = (asyncio.run(reconcile(api, e, status, S, None, NOW, writer=api.writer))[0].written or {})
    assert status["build"]["job"] == retry and not [w for w in api.writes if w[1] == "Job"]


def test_a_pod_state_without_a_termination_keeps_no_exit() -> None:
    assert pod_state({"metadata": {"name": "p"}, "status": {}}).last_exit is None
    assert PodState("p", ready=True, fingerprint=None).last_exit is None
