"""Canary retunes through plan() (issue 18, "Canary retunes"): a change the tuner proposes for a gain goes to one
pod first, is judged against the pods beside it, and is promoted or rolled back, with status, Events and the
rendered Deployments saying so at every step; protective changes, single pods and hostile status get none.

A small fake cluster follows each plan as the Deployment controller would (at once): the pods are those the
rendered Deployments ask for, each running the limit its template gives it; each group's window is the share of
its requests served in time that the test chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from kvpilot.api.status import parse_status, status_dict
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.window import KvWindow
from kvpilot.desired import labels as L
from kvpilot.desired.observed import DeploymentState, Observed, PodState
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.autotune.whatif import WhatIf
from tests.unit.helpers import engine
from tests.unit.test_plan import built

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
SLO = {"timeToFirstTokenMillis": 3000, "timePerOutputTokenMillis": 60}


def tuned(replicas: int = 2, canary: str = "Auto", strategy: str = "NoSurge", **more: Any) -> Any:
    return engine(serving__replicas=replicas, serving__rollout={"strategy": strategy},
                  autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 1024, "intervalSeconds": 15,
                            "canary": canary, "slo": SLO}, **more)


def kv(limit: int, share: float, pods: int = 1, rate: float = 30.0) -> KvWindow:
    """A group's 15 s window at ``limit``: ``share`` of its resolved requests met both objectives."""
    return KvWindow(samples=20, pods=pods, peak_utilization=0.3, mean_utilization=0.2, peak_used_blocks=100,
                    max_blocks=1000, tokens_per_block=32, peak_active=min(limit, 400), mean_active=min(limit, 400),
                    peak_queued=0, mean_queued=0.0, paused=0, runtime_batch_size=limit, window_seconds=15.0,
                    completion_rate=rate, arrival_rate=rate, prompt_mean=150.0, output_mean=600.0,
                    resolved_rate=rate, good_rate=rate * share, ttft_miss_fraction=0.0, tpot_miss_fraction=0.0,
                    ttft_p95_ms=500.0, tpot_p95_ms=10.0)


def _state(dep: dict[str, Any]) -> DeploymentState:
    """A rendered Deployment as the controller leaves it once converged."""
    n = dep["spec"]["replicas"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    return DeploymentState(1, 1, n, n, n, n, False, annotations.get(L.FINGERPRINT_ANNOTATION),
                           annotations.get(L.BATCH_ANNOTATION), annotations.get(L.CONFIG_HASH_ANNOTATION), pods=n,
                           image=dep["spec"]["template"]["spec"]["containers"][0]["image"])


@dataclass
class Cluster:
    """What the cluster runs after each plan: the Deployments it applied, converged, and their pods."""

    observed: Observed
    plans: list[Plan] = field(default_factory=list)
    canary_ready_after: int = 0  # plans before the canary pod is Ready

    def follow(self, p: Plan) -> None:
        self.plans.append(p)
        deps = {d["metadata"]["name"]: d for d in p.apply if d["kind"] == "Deployment"}
        main = deps.get(L.deployment_name("e1"))
        canary = deps.get(L.canary_deployment_name("e1"))
        pods: list[PodState] = []
        if main is not None:
            batch = main["spec"]["template"]["metadata"]["annotations"][L.BATCH_ANNOTATION]
            pods += [PodState(f"e1-{k}", True, None, ip=f"10.0.0.{k}", max_batch_size=batch)
                     for k in range(main["spec"]["replicas"])]
        if canary is not None and canary["spec"]["replicas"]:
            batch = canary["spec"]["template"]["metadata"]["annotations"][L.BATCH_ANNOTATION]
            ready = sum(1 for q in self.plans if _canary_pods(q)) > self.canary_ready_after
            pods.append(PodState("e1-canary-x", ready, None, ip="10.0.1.1", canary=True, max_batch_size=batch,
                                 started_at="2026-12-03T12:00:00Z"))
        self.observed = replace(self.observed, status=p.status, deployment=_state(main) if main else None,
                                canary_deployment=_state(canary) if canary else None, pods=tuple(pods))


def _canary_pods(p: Plan) -> int:
    return next((d["spec"]["replicas"] for d in p.apply if d["metadata"]["name"] == "e1-kvpilot-canary"), 0)


def _main_pods(p: Plan) -> int:
    return next(d["spec"]["replicas"] for d in p.apply if d["kind"] == "Deployment" and d["metadata"]["name"] == "e1")


def propose(monkeypatch: pytest.MonkeyPatch, decision: Decision, at_s: float = 120.0) -> None:
    """The tuner's rules propose ``decision`` once, ``at_s`` into the run (from the value it starts from), and hold
    otherwise; the what-if confirms whatever they propose."""
    from kvpilot.autotune import policy

    done = {"yes": False}

    def rules(inp: Any, w: Any, lo: int, hi: int) -> Decision:
        if not done["yes"] and inp.now >= T0 + timedelta(seconds=at_s) and inp.current != decision.target:
            done["yes"] = True
            return decision
        return Decision("Hold", inp.current, "NoPressure", "fine")

    monkeypatch.setattr(policy, "decide_from_signals", rules)
    monkeypatch.setattr(policy, "what_if_verdict", lambda _e, _w, cur, options, *a, **k: WhatIf(max(options), "confirmed"))


def run(e: Any, share: Callable[[int, bool], float], steps: int = 60, surge_room: int | None = None,
        status: Any = None, canary_ready_after: int = 0, canary_reports: bool = True) -> Cluster:
    """``steps`` plans 15 s apart; ``share(limit, canary)``: the share a group at ``limit`` serves in time;
    ``canary_reports``: whether a Ready canary pod's metrics reach the sampler."""
    first = plan(e, Observed(claim_phase="Bound"), Settings(), T0)
    observed = replace(built(first), surge_room=surge_room)
    if status is not None:
        observed = replace(observed, status=parse_status(status))
    cluster = Cluster(observed, canary_ready_after=canary_ready_after)
    cluster.follow(plan(e, observed, Settings(), T0))
    for k in range(1, steps):
        o = cluster.observed
        main = [p for p in o.pods if not p.canary]
        canary = [p for p in o.pods if p.canary and p.ready]
        limit = int(main[0].max_batch_size or 64) if main else 64
        whole = kv(limit, share(limit, False), pods=len(main))
        groups: dict[str, Any] = {}
        if canary and canary_reports:
            value = int(canary[0].max_batch_size or 0)
            groups = dict(canary_kv=kv(value, share(value, True)), others_kv=kv(limit, share(limit, False),
                                                                              pods=len(main)))
        cluster.follow(plan(e, replace(o, kv=whole, **groups), Settings(), T0 + timedelta(seconds=15 * k)))
    return cluster


def doc(p: Plan) -> dict[str, Any]:
    return status_dict(p.status)


def test_a_raise_the_canary_serves_worse_never_reaches_the_other_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.10 if limit == 512 else 0.56)
    values = [p.status.batching.max_batch_size for p in c.plans if p.status.batching]
    assert set(values) == {64}, "the old pods never left 64"
    started = next(i for i, p in enumerate(c.plans) if _canary_pods(p) == 1)
    ended = next(i for i, p in enumerate(c.plans) if i > started and _canary_pods(p) == 0)
    # Without a spare GPU the first replaced pod is the canary: one old pod gives its GPU up from the start.
    assert all(_main_pods(p) == 1 for p in c.plans[started:ended]) and _main_pods(c.plans[ended]) == 2
    start = doc(c.plans[started])["autotune"]
    assert start["canary"]["phase"] == "Running" and start["canary"]["toBatchSize"] == 512
    assert start["history"][0]["action"] == "Raise" and "canary" in start["history"][0]["message"]
    assert [ev.reason for ev in c.plans[started].events] == ["CanaryStarted"]
    progressing = next(x for x in doc(c.plans[started + 1])["conditions"] if x["type"] == "Progressing")
    assert progressing["reason"] == "CanaryRunning"
    end = doc(c.plans[ended])["autotune"]
    assert end["canary"]["outcome"] == "RolledBack" and "phase" not in end["canary"]
    assert "the canary at 512 serves" in end["canary"]["message"] and "pods at 64 meanwhile" in end["canary"]["message"]
    assert end["history"][0]["reason"] == "RolledBack" and (end["history"][0]["fromBatchSize"],
                                                            end["history"][0]["toBatchSize"]) == (512, 64)
    assert any(b["direction"] == "Raise" and 64 < b["batchSize"] <= 512 for b in end["verification"]["bars"])
    warning = [ev for ev in c.plans[ended].events if ev.reason == "CanaryRolledBack"]
    assert warning and warning[0].type == "Warning" and "good req/s" in warning[0].message
    # Judged on a minute or two of evidence, not the 15-minute give-up.
    assert 3 <= ended - started <= 12, ended - started
    # The canary Deployment stays at 0 pods (kvpilot deletes nothing), and nothing moves again at this load.
    assert all(_canary_pods(p) == 0 for p in c.plans[ended:])
    assert all(not ev.reason.startswith("Canary") for p in c.plans[ended + 1:] for ev in p.events)


def _canary_batch(p: Plan) -> str | None:
    dep = next((d for d in p.apply if d["kind"] == "Deployment" and d["metadata"]["name"] == "e1-kvpilot-canary"), None)
    return dep["spec"]["template"]["metadata"]["annotations"][L.BATCH_ANNOTATION] if dep is not None else None


def test_a_rolled_back_canary_deployment_keeps_the_value_it_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by tests/e2e/test_canary.py: the rollback re-rendered the idle canary Deployment at the old pods'
    value, a template write (a new ReplicaSet) beside the pod still draining, and the object no longer said what
    had been tried. Between canaries it stays at 0 pods with the value its last canary ran."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.10 if limit == 512 else 0.56)
    ended = next(i for i, p in enumerate(c.plans) if _canary_pods(p) == 1 and _canary_pods(c.plans[i + 1]) == 0) + 1
    assert doc(c.plans[ended])["autotune"]["canary"]["outcome"] == "RolledBack"
    assert {_canary_batch(p) for p in c.plans[ended:]} == {"512"}
    assert c.plans[-1].status.batching is not None and c.plans[-1].status.batching.max_batch_size == 64


def test_an_idle_canary_deployment_above_the_engines_ceiling_is_rendered_at_the_value_in_force() -> None:
    """The value an idle canary Deployment holds is kept only where the engine may run it (status and the
    Deployment are writable by others; a rebuilt engine may have a lower ceiling)."""
    from kvpilot.desired.canary import idle_value

    def held(value: str | None) -> Observed:
        return Observed(canary_deployment=DeploymentState(1, 1, 0, 0, 0, 0, False, None, value, None))

    assert idle_value(held("512"), 64, 1024) == 512
    assert idle_value(held("2048"), 64, 1024) == 64
    assert idle_value(held("0"), 64, None) == 64
    assert idle_value(held("-3"), 64, None) == 64
    assert idle_value(held(None), 64, None) == 64
    assert idle_value(Observed(), 64, None) == 64


def test_a_raise_the_canary_serves_as_well_is_promoted_and_then_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.58 if limit == 512 else 0.56)
    promoted = next(i for i, p in enumerate(c.plans) if p.status.batching and p.status.batching.max_batch_size == 512)
    d = doc(c.plans[promoted])
    assert d["batching"]["reason"] == "AutotuneRaised" and "promoted after its canary" in d["batching"]["message"]
    assert d["autotune"]["canary"]["phase"] == "Promoting" and d["autotune"]["canary"]["outcome"] == "Promoted"
    assert d["autotune"]["verification"]["watch"]["toBatchSize"] == 512  # verified on every pod as any change
    assert {"CanaryPromoted", "BatchSizeChanged"} <= {ev.reason for ev in c.plans[promoted].events}
    assert _main_pods(c.plans[promoted]) == 2
    # Without a spare GPU the canary leaves at once: its GPU is the one the old pods' second replica needs.
    assert _canary_pods(c.plans[promoted]) == 0
    last = doc(c.plans[-1])["autotune"]
    assert "phase" not in last["canary"] and last["canary"]["outcome"] == "Promoted"
    assert c.plans[-1].status.batching is not None and c.plans[-1].status.batching.max_batch_size == 512
    raises = [h for h in last["history"] if h["action"] == "Raise"]
    assert len(raises) == 1, "one change, recorded once"


def test_with_a_spare_gpu_capacity_never_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary starts beside every old pod; one old pod goes only once the canary is Ready; promoted, the
    canary stays until the old pods have rolled."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(strategy="Auto", canary="Always"), lambda limit, canary: 0.58 if limit == 512 else 0.56,
            surge_room=2,
            canary_ready_after=2)
    started = next(i for i, p in enumerate(c.plans) if _canary_pods(p) == 1)
    assert doc(c.plans[started])["autotune"]["canary"]["spare"] is True
    assert [_main_pods(p) for p in c.plans[started:started + 4]] == [2, 2, 2, 1]  # Ready after 3 plans
    promoted = next(i for i, p in enumerate(c.plans) if p.status.batching and p.status.batching.max_batch_size == 512)
    assert _canary_pods(c.plans[promoted]) == 1 and _main_pods(c.plans[promoted]) == 2
    assert _canary_pods(c.plans[-1]) == 0


@pytest.mark.parametrize("reason", ["TpotObjectiveBroken", "KvCachePressure", "RequestsPaused"])
def test_a_protective_lower_goes_to_every_pod_at_once(monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    propose(monkeypatch, Decision("Lower", 32, reason, "the measurements call for it"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=14)
    assert all(_canary_pods(p) == 0 for p in c.plans)
    assert c.plans[-1].status.batching is not None and c.plans[-1].status.batching.max_batch_size == 32


@pytest.mark.parametrize("e", [tuned(replicas=1), tuned(canary="Off")], ids=["one-replica", "canary-off"])
def test_no_canary_without_pods_to_compare_or_when_off(monkeypatch: pytest.MonkeyPatch, e: Any) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(e, lambda limit, canary: 0.56, steps=14)
    assert all(_canary_pods(p) == 0 and not any(d["metadata"]["name"] == "e1-kvpilot-canary" for d in p.apply)
               for p in c.plans)
    assert c.plans[-1].status.batching is not None and c.plans[-1].status.batching.max_batch_size == 512


def test_a_canary_that_cannot_be_judged_is_rolled_back_fifteen_minutes_after_it_is_ready_and_barred_nowhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary pod is Ready but its metrics never arrive: no verdict; rolled back 15 minutes after it was Ready,
    with no bar (nothing was measured against the value)."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=80, canary_reports=False)
    started = next(i for i, p in enumerate(c.plans) if _canary_pods(p) == 1)
    ended = next(i for i, p in enumerate(c.plans) if i > started and _canary_pods(p) == 0)
    assert 60 <= ended - started <= 63  # Ready one pass after it started
    end = doc(c.plans[ended])["autotune"]
    assert end["canary"]["outcome"] == "RolledBack" and "cannot be judged" in end["canary"]["message"]
    assert not (end.get("verification") or {}).get("bars"), end.get("verification")


def test_a_canary_pod_that_never_becomes_ready_is_given_its_start_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """serving.startupTimeoutSeconds (plus a drain) for a canary pod that never becomes Ready, then rolled back
    without a bar: a slow model load is no verdict on the value."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    e = tuned(serving__startupTimeoutSeconds=600)
    c = run(e, lambda limit, canary: 0.56, steps=80, canary_ready_after=10_000)
    started = next(i for i, p in enumerate(c.plans) if _canary_pods(p) == 1)
    ended = next(i for i, p in enumerate(c.plans) if i > started and _canary_pods(p) == 0)
    assert (ended - started) * 15 == pytest.approx(600 + 305, abs=16)
    end = doc(c.plans[ended])["autotune"]
    assert "was not Ready" in end["canary"]["message"] and not (end.get("verification") or {}).get("bars")


def test_a_user_reset_of_the_start_value_ends_the_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    e = tuned()
    c = run(e, lambda limit, canary: 0.56, steps=12)
    assert _canary_pods(c.plans[-1]) == 1
    reset = tuned(batching__maxBatchSize=128)
    p = plan(reset, replace(c.observed, kv=kv(64, 0.56, pods=1)), Settings(), T0 + timedelta(seconds=200))
    assert _canary_pods(p) == 0 and _main_pods(p) == 2
    assert p.status.batching is not None and p.status.batching.max_batch_size == 128


@pytest.mark.parametrize("hostile", [
    {"phase": "Running", "fromBatchSize": 64, "toBatchSize": 64, "startedAt": "2026-12-03T11:59:00Z"},
    {"phase": "Running", "fromBatchSize": -1, "toBatchSize": 512, "startedAt": "2026-12-03T11:59:00Z"},
    {"phase": "Running", "fromBatchSize": 64, "toBatchSize": 512, "startedAt": "soon"},
    {"phase": "Running", "fromBatchSize": 64, "toBatchSize": 512, "startedAt": "2999-01-01T00:00:00Z"},
    {"phase": "Exploding", "fromBatchSize": 64, "toBatchSize": 512, "startedAt": "2026-12-03T11:59:00Z"},
    {"phase": "Running", "fromBatchSize": "64", "toBatchSize": [512], "canary": {"windowsMilli": -5}},
])
def test_a_malformed_canary_status_starts_nothing(monkeypatch: pytest.MonkeyPatch, hostile: Any) -> None:
    """A hand-edited record that does not hold reads as no canary: every replica on the engine's own Deployment,
    none on a canary, no promotion, nothing raises."""
    propose(monkeypatch, Decision("Hold", 64, "NoPressure", "fine"), at_s=1e9)
    e = tuned()
    first = plan(e, Observed(claim_phase="Bound"), Settings(), T0)
    status = dict(status_dict(built(first).status), autotune={"canary": hostile})
    c = run(e, lambda limit, canary: 0.56, steps=6, status=status)
    assert all(_canary_pods(p) == 0 and _main_pods(p) == 2 for p in c.plans)
    assert all(p.status.batching is not None and p.status.batching.max_batch_size == 64 for p in c.plans)


@pytest.mark.parametrize("room, canaried", [(2, False), (1, True), (0, True)])
def test_auto_tries_one_pod_first_only_where_the_rollout_cannot_restart_every_pod_at_once(
        monkeypatch: pytest.MonkeyPatch, room: int, canaried: bool) -> None:
    """With a free GPU for every pod the rollout restarts them all in one start and verification judges the
    change after it; with fewer, a bad change would reach pod after pod, and a canary judges it first."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(strategy="Auto"), lambda limit, canary: 0.56, steps=12, surge_room=room)
    assert any(_canary_pods(p) for p in c.plans) is canaried
    first = next(p for p in c.plans if p.decision is not None and p.decision.action == "Raise")
    assert ("canary" in first.decision.message) is canaried


def test_while_a_canary_runs_the_hold_names_it_and_its_pod_counts_as_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=11)
    p = c.plans[-1]
    assert _canary_pods(p) == 1 and p.decision is not None
    assert p.decision.reason == "RolloutInProgress" and "a canary at 512 is judged" in p.decision.message
    available = next(x for x in doc(p)["conditions"] if x["type"] == "Available")
    assert available["message"].startswith("2/2 pods serve"), available
