"""A running canary that no longer applies is abandoned, said so, and leaves nothing behind: the spec moved under
it (tuning off, canaries off, new bounds, one replica), a new engine rolls out, or the pods beside it need a
protective change now. Abandoned is not rolled back: no bar (nothing was measured against the value), a Normal
Event, and a history record that cancels the canary's start in the tuner's anti-oscillation memory. And a canary
never starts under a Deployment name another object holds."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from kvpilot.autotune.decision import Decision
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.tuning import recent_changes
from tests.unit.test_plan_canary import T0, SLO, Cluster, _canary_pods, _main_pods, doc, kv, propose, run, tuned

LATER = T0 + timedelta(seconds=200)


def running(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """A canary 64 -> 512 that has run a few intervals without a verdict (both groups serve alike)."""
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=11)
    assert _canary_pods(c.plans[-1]) == 1 and doc(c.plans[-1])["autotune"]["canary"]["phase"] == "Running"
    return c


def next_plan(c: Cluster, e: Any, **observed: Any) -> Plan:
    return plan(e, replace(c.observed, kv=kv(64, 0.56), **observed), Settings(), LATER)


def assert_abandoned(p: Plan, why: str) -> None:
    assert _canary_pods(p) == 0 and _main_pods(p) == 2
    at = doc(p)["autotune"]
    canary = at["canary"]
    assert "phase" not in canary and canary["outcome"] == "Abandoned" and why in canary["message"], canary
    assert not (at.get("verification") or {}).get("bars"), at.get("verification")
    assert at["history"][0]["reason"] == "RolledBack" and at["history"][0]["message"].startswith("canary abandoned")
    assert [ev.reason for ev in p.events if ev.reason.startswith("Canary")] == ["CanaryAbandoned"]
    assert next(ev for ev in p.events if ev.reason == "CanaryAbandoned").type == "Normal"
    # The canary's start and its undoing leave the anti-oscillation memory together: 512 was never in force.
    assert recent_changes(p.status, LATER) == ()


@pytest.mark.parametrize("change, why", [
    (dict(autotune={"enabled": False}), "disabled or in mode Advisory"),
    (dict(autotune={"mode": "Advisory", "canary": "Auto", "slo": SLO}), "disabled or in mode Advisory"),
    (dict(autotune={"mode": "Auto", "canary": "Off", "slo": SLO}), "autotune.canary is Off"),
    (dict(replicas=1), "two or more single-node replicas"),
    (dict(autotune={"mode": "Auto", "canary": "Auto", "maxBatchSize": 256, "slo": SLO}), "outside autotune.minBatchSize"),
])
def test_a_canary_the_spec_no_longer_allows_is_abandoned(monkeypatch: pytest.MonkeyPatch, change: dict[str, Any],
                                                         why: str) -> None:
    c = running(monkeypatch)
    e = tuned(**{k: v for k, v in change.items() if k != "autotune"})
    if "autotune" in change:
        from tests.unit.helpers import engine
        e = engine(serving__replicas=2, serving__rollout={"strategy": "NoSurge"}, autotune=change["autotune"])
    p = next_plan(c, e)
    if "replicas" in change:
        assert _canary_pods(p) == 0 and _main_pods(p) == 1
        assert doc(p)["autotune"]["canary"]["outcome"] == "Abandoned"
        return
    assert_abandoned(p, why)
    # Switched back on, nothing of it comes back: no canary runs, no second ending.
    again = plan(tuned(), replace(c.observed, status=p.status, kv=kv(64, 0.56)), Settings(), LATER + timedelta(hours=1))
    assert _canary_pods(again) == 0 and not [ev for ev in again.events if ev.reason.startswith("Canary")]


def test_a_canary_is_abandoned_when_a_new_engine_rolls_out(monkeypatch: pytest.MonkeyPatch) -> None:
    c = running(monkeypatch)
    old = replace(c.observed.canary_deployment, fingerprint="0" * 64)  # written for the engine served before
    assert_abandoned(next_plan(c, tuned(), canary_deployment=old), "a new engine")


def test_a_canary_is_abandoned_when_the_pods_beside_it_need_a_protective_lower(monkeypatch: pytest.MonkeyPatch) -> None:
    c = running(monkeypatch)
    from kvpilot.autotune import policy

    def rules(inp: Any, w: Any, lo: int, hi: int) -> Decision:
        return Decision("Lower", 32, "KvCachePressure", "the pool is full at 64")

    monkeypatch.setattr(policy, "decide_from_signals", rules)
    assert_abandoned(next_plan(c, tuned(), others_kv=kv(64, 0.56), canary_kv=kv(512, 0.56)), "KvCachePressure")


def test_no_canary_starts_under_a_name_another_object_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=8)
    taken = plan(tuned(), replace(c.observed, kv=kv(64, 0.56, pods=2), canary_name_taken=True), Settings(),
                 T0 + timedelta(seconds=150))
    assert _canary_pods(taken) == 0 and taken.status.batching is not None
    assert taken.status.batching.max_batch_size == 512  # the change goes to every pod, verified after it
