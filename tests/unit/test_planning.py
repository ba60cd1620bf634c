"""The live what-if: a plan that may simulate runs off the event loop, within a CPU budget per engine
(kvpilot/planning.py, autotune/gate.py); once the budget is spent the tuner holds the changes the simulation must
confirm (the gate's WhatIfBudgetSpent); and kvsim's clock speed-up is taken out of the live arrival rate."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot import planning
from kvpilot.api.status import EngineInfo, EngineStatus
from kvpilot.autotune import policy as policy_module
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import WhatIfGate, may_simulate
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.observe.signals import engine_time
from kvpilot.autotune.whatif import WhatIf
from tests.unit.helpers import engine
from tests.unit.test_plan import built

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
TUNED = {"autotune": {"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 512}}


def window(rate: float = 2.0, prompt: float = 500, output: float = 200) -> KvWindow:
    return KvWindow(samples=20, pods=1, peak_utilization=0.3, mean_utilization=0.2, peak_used_blocks=100,
                    max_blocks=1000, tokens_per_block=32, peak_active=64, mean_active=60.0, peak_queued=10,
                    mean_queued=5.0, paused=0, runtime_batch_size=64, arrival_rate=rate, prompt_mean=prompt,
                    output_mean=output)


def test_may_simulate_needs_tuning_a_profile_and_a_traffic_fit() -> None:
    spec = engine(**TUNED).spec
    assert may_simulate(spec, window())
    assert not may_simulate(spec, window(rate=0))
    assert not may_simulate(spec, window(prompt=0))
    assert not may_simulate(spec, None)
    assert not may_simulate(engine(autotune={"enabled": False}).spec, window())  # tuning off
    assert not may_simulate(engine("tensorrt", **TUNED).spec, window())  # no kvsim profile


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_budget_is_per_engine_and_per_hour() -> None:
    clock = Clock()
    p = planning.Planner(cpu_seconds_per_hour=10.0, clock=clock)
    p.charge(("ns", "a"), 6.0)
    clock.t = 1800
    p.charge(("ns", "a"), 5.0)
    assert p.budget.spent(("ns", "a")) == 11.0 and p.budget.spent(("ns", "b")) == 0.0
    assert not p.budget.left(("ns", "a")) and p.budget.left(("ns", "b"))
    clock.t = 3601  # the first run left the hour
    assert p.budget.spent(("ns", "a")) == 5.0 and p.budget.left(("ns", "a"))
    p.forget(("ns", "a"))
    assert p.budget.spent(("ns", "a")) == 0.0


def test_a_simulating_plan_runs_in_the_worker_while_the_loop_keeps_running(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def slow_plan(e: Any, observed: Observed, settings: Settings, now: datetime,
                  what_if: WhatIfGate = WhatIfGate()) -> str:
        seen["thread"] = threading.current_thread().name
        seen["allowed"] = what_if.budget_left
        end = time.thread_time() + 0.3
        while time.thread_time() < end:  # CPU, as a simulation burns it
            pass
        return "plan"

    monkeypatch.setattr(planning, "plan", slow_plan)
    planner = planning.Planner(cpu_seconds_per_hour=0.2)
    e = engine(**TUNED)

    async def main() -> tuple[Any, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        out = await planner.plan(e, Observed(kv=window()), Settings(), NOW)
        task.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out == "plan" and seen["thread"].startswith("kvpilot-whatif") and seen["allowed"] is True
    assert ticks >= 5, "the event loop stalled while the what-if ran"
    assert planner.budget.spent(("ns", "e1")) >= 0.25
    # Budget spent: the next plan runs inline, with the simulation off.
    asyncio.run(planner.plan(e, Observed(kv=window()), Settings(), NOW))
    assert seen["thread"] == threading.current_thread().name and seen["allowed"] is False
    planner.close()


def test_a_plan_that_cannot_simulate_runs_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    monkeypatch.setattr(planning, "plan", lambda *a, **k: threads.append(threading.current_thread().name))
    asyncio.run(planning.Planner().plan(engine(**TUNED), Observed(kv=window(rate=0)), Settings(), NOW))
    assert threads == [threading.current_thread().name]


def served(allowed: bool, decision: Decision, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """plan() with the rules stubbed to ``decision`` (and a simulation that confirms it), the gate's budget
    spent or not: the guarantees, the cooldown and the gate still apply."""
    monkeypatch.setattr(policy_module, "decide_from_signals", lambda *a: decision)
    monkeypatch.setattr(policy_module, "what_if_verdict", lambda *a, **_k: WhatIf(decision.target, "confirmed"))
    e = engine(**TUNED)
    first = plan(e, Observed(claim_phase="Bound"), Settings(), NOW)
    good = plan(e, built(first), Settings(), NOW)
    observed = replace(Observed(status=good.status, claim_phase="Bound",
                                engine_index={first.fingerprint: good.index_entry[2]}),  # type: ignore[index]
                       kv=window())
    p = plan(e, observed, Settings(), NOW, what_if=WhatIfGate(budget_left=allowed))
    assert p.decision is not None
    return {"action": p.decision.action, "reason": p.decision.reason}


def test_without_budget_an_unconfirmed_change_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    raise_ = Decision("Raise", 128, "QueueWithHeadroom", "queue with headroom")
    assert served(True, raise_, monkeypatch) == {"action": "Raise", "reason": "QueueWithHeadroom"}
    assert served(False, raise_, monkeypatch) == {"action": "Hold", "reason": "WhatIfBudgetSpent"}
    protect = Decision("Lower", 32, "RequestsPaused", "requests paused")
    assert served(False, protect, monkeypatch) == {"action": "Lower", "reason": "RequestsPaused"}


@pytest.mark.parametrize("speedup, expected", [(1, 2.0), (10, 0.2)])
def test_the_live_rate_is_in_the_engines_own_time(speedup: int, expected: float) -> None:
    e = engine(runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "speedupRatio": speedup})
    out = engine_time(window(rate=2.0), e.spec)
    assert out is not None and out.arrival_rate == pytest.approx(expected)
    assert engine_time(window(rate=2.0), engine("tensorrt").spec).arrival_rate == 2.0  # type: ignore[union-attr]
    assert engine_time(None, e.spec) is None


SLO = {"timeToFirstTokenMillis": 1000, "timePerOutputTokenMillis": 50}


def measured(rate_per_pod: float, misses: float, limit: int = 4) -> Observed:
    w = replace(window(rate=rate_per_pod, prompt=220, output=250), pods=2, runtime_batch_size=limit,
                completion_rate=min(rate_per_pod, 3.0), ttft_miss_fraction=misses)
    return Observed(kv=w, status=EngineStatus(engine=EngineInfo(max_batch_size=256)))


def test_the_what_if_is_trusted_only_where_its_model_shows_the_pods_misses() -> None:
    e = engine(autotune={"mode": "Auto", "minBatchSize": 4, "maxBatchSize": 256, "slo": SLO})
    # Light traffic that 4 slots serve per the model, yet half the requests missed: pods slower than the
    # model (a starved host), so the model's "nothing to gain" is not to be trusted.
    assert planning.model_reproduces(e, measured(1.7, misses=0.5)) is False
    # The same traffic without misses: nothing to check.
    assert planning.model_reproduces(e, measured(1.7, misses=0.0)) is True
    # A true overload (12 req/s per pod on 4 slots): the model misses too and stays in charge.
    assert planning.model_reproduces(e, measured(12.0, misses=0.9)) is True
    # Without latency histograms (1.2, TensorRT backend): a queue beside a full batch is the evidence.
    no_histograms = measured(1.7, misses=0.0)
    assert no_histograms.kv is not None
    queued = replace(no_histograms, kv=replace(no_histograms.kv, ttft_miss_fraction=None, mean_queued=2.0,
                                               peak_active=4))
    assert planning.model_reproduces(e, queued) is False
    idle = replace(no_histograms, kv=replace(no_histograms.kv, ttft_miss_fraction=None, mean_queued=0.0))
    assert planning.model_reproduces(e, idle) is True


def test_an_invalid_model_leaves_the_rules_alone_without_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(policy_module, "decide_from_signals", lambda inp, *a: seen.append(inp) or Decision(
        "Raise", 128, "QueueWithHeadroom", "queue"))
    e = engine(**TUNED)
    first = plan(e, Observed(claim_phase="Bound"), Settings(), NOW)
    good = plan(e, built(first), Settings(), NOW)
    observed = Observed(status=good.status, claim_phase="Bound", kv=window(),
                        engine_index={first.fingerprint: good.index_entry[2]})  # type: ignore[index]
    for gate in (WhatIfGate(model_valid=False), WhatIfGate(model_valid=False, budget_left=False)):
        p = plan(e, observed, Settings(), NOW, what_if=gate)
        assert seen[-1].what_if.model is not None, "the served engine has a kvsim model"
        assert seen[-1].simulation is None and p.decision is not None and p.decision.action == "Raise"
