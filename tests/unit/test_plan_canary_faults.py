"""A canary pod that fails is rolled back at once, not after the 15 minutes a canary without a verdict waits: a
pod that crash-loops at the new value (a larger batch can exhaust GPU memory at start-up), or one that cannot be
scheduled long after the GPU it was given should have freed. Either way one old pod would otherwise stay down."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from kvpilot.autotune.decision import Decision
from kvpilot.desired.canary_checks import UNSCHEDULABLE_SECONDS
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from tests.unit.test_plan_canary import T0, Cluster, _canary_pods, _main_pods, doc, kv, propose, run, tuned


def _with_canary_pod(observed: Observed, **state: Any) -> Observed:
    pods = tuple(replace(p, ready=False, **state) if p.canary else p for p in observed.pods)
    return replace(observed, pods=pods)


def _running(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    propose(monkeypatch, Decision("Raise", 512, "QueueWithHeadroom", "requests queue"))
    c = run(tuned(), lambda limit, canary: 0.56, steps=10, canary_ready_after=10_000)
    assert _canary_pods(c.plans[-1]) == 1
    return c


def test_a_crash_looping_canary_is_rolled_back_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _running(monkeypatch)
    o = _with_canary_pod(c.observed, waiting_reason="CrashLoopBackOff", restarts=3,
                         last_exit="exit code 1 (Error): CUDA out of memory")
    p = plan(tuned(), replace(o, kv=kv(64, 0.56)), Settings(), T0 + timedelta(seconds=160))
    assert _canary_pods(p) == 0 and _main_pods(p) == 2
    canary = doc(p)["autotune"]["canary"]
    assert canary["outcome"] == "RolledBack" and "CrashLoopBackOff" in canary["message"]
    assert "CUDA out of memory" in canary["message"]
    assert "CanaryRolledBack" in [ev.reason for ev in p.events]  # beside Degraded's PodsFailing


def test_an_unschedulable_canary_waits_for_the_gpu_it_was_given_then_is_rolled_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = _running(monkeypatch)
    o = _with_canary_pod(c.observed, unschedulable_message="0/4 nodes are available: 4 Insufficient nvidia.com/gpu")
    started = T0 + timedelta(seconds=120)
    early = plan(tuned(), replace(o, kv=kv(64, 0.56)), Settings(), started + timedelta(seconds=150))
    assert _canary_pods(early) == 1  # the old pod it replaces may still be draining
    late = plan(tuned(), replace(o, kv=kv(64, 0.56)), Settings(),
                started + timedelta(seconds=UNSCHEDULABLE_SECONDS + 30))
    assert _canary_pods(late) == 0 and _main_pods(late) == 2
    assert "could not be scheduled" in doc(late)["autotune"]["canary"]["message"]
