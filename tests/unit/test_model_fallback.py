"""The calibrated model in the tuner (issue 18, sections 3-4): the gate binds the fitted engine, and where the
model disagrees with the pods by more than its bound the tuner decides from measurements alone, in small steps.

The planner here is the operator's (kvpilot/planning.py), fed the way the loop feeds it: a kvsim pod's drained
``/metrics`` parsed by the operator's parser, one window at a time.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kvsim import Engine as KvsimEngine, Profile

from kvpilot.api.status import AutotuneStatus, EngineStatus, ModelStatus, ModelTrust
from kvpilot.autotune.gate import WhatIfGate, engine_model, may_simulate
from kvpilot import planning
from kvpilot.autotune import trust
from kvpilot.autotune.policy import decide
from kvpilot.autotune.trust import MODEL_TRUSTED, model_status
from kvpilot.autotune.whatif import WhatIf, sim_config
from kvpilot.desired.observed import Observed
from kvpilot.desired.settings import Settings
from kvpilot.planning import Planner
from kvpilot.trtllm.metrics import parse_iteration_stats
from tests.unit.helpers import engine as make_engine
from tests.unit.test_autotune_policy import inp, window
from tests.unit.test_calibrate import SLOW, traffic

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
A100 = {"serving__gpuProduct": "NVIDIA-A100-SXM4-80GB"}
CPU = re.compile(r" \([0-9.]+ CPU-s\)")  # a decision message's timing, not its content


def full_batch_queueing() -> Any:
    return window(util=0.30, active=64, queued=20)


def test_a_distrusted_model_raises_in_small_steps_and_says_so() -> None:
    trusted = decide(inp(w=full_batch_queueing(), replicas=1))
    careful = decide(inp(w=full_batch_queueing(), replicas=1, what_if=WhatIfGate(measured_only=True)))
    assert trusted.action == careful.action == "Raise"
    assert careful.target <= 96 < trusted.target  # at most x1.5 from 64; the rules alone size x2 here
    assert "at most x1.5" in careful.message and "at most x1.5" not in trusted.message
    # The smaller step must still pay for its restart: over 4 pods restarted in turn this one does not.
    assert decide(inp(w=full_batch_queueing(), what_if=WhatIfGate(measured_only=True))).reason == "NotWorthARestart"


def test_a_distrusted_model_is_not_simulated_and_its_changes_do_not_wait_for_a_budget() -> None:
    model = engine_model(make_engine().spec, 1024, restart_seconds=90.0, surge_pods=0)
    assert model is not None
    assert WhatIfGate(model=model).engine is model
    gate = WhatIfGate(model=model, measured_only=True, budget_left=False)
    assert gate.engine is None  # no simulation: the rules decide, from measurements
    raised = decide(inp(w=full_batch_queueing(), replicas=1, what_if=gate))
    assert raised.action == "Raise"  # not WhatIfBudgetSpent: there is nothing to confirm it with


def test_protective_lowers_keep_their_size_when_the_model_is_distrusted() -> None:
    paused = window(util=0.8, active=64, paused=3)
    assert decide(inp(w=paused, what_if=WhatIfGate(measured_only=True))).target == decide(inp(w=paused)).target


def feed(planner: Planner, engine: Any, profile: Profile, seconds: float = 240.0, limit: int = 64,
         slow_by: float = 1.0) -> None:
    """One kvsim pod serving Poisson traffic, its /metrics drained into the planner every 15 s (the loop's
    path); ``slow_by`` stretches every reported latency (an engine nothing in kvsim's calibration describes)."""
    pod = KvsimEngine(sim_config(profile, 1024, limit, "GuaranteedNoEvict"))
    pending = traffic(15.0, seconds)
    t = 15.0
    while t <= seconds:
        while pending and pending[0].arrival_s <= t:
            pod.submit(pending.pop(0))
        pod.advance_to(t)
        stats = [{**s, "iterLatencyMS": s["iterLatencyMS"] * (slow_by if (t // 15) % 2 else 1.0)}
                 for s in pod.drain_iteration_stats()]
        planner.observe_pods(engine, {"pod-0": parse_iteration_stats(stats, NOW.timestamp() + t)}, None,
                             NOW.timestamp() + t, limit)
        t += 15.0


def test_a_real_engine_gets_a_calibrated_what_if_and_status_says_how_good_it_is() -> None:
    """A tensorrt engine on an A100: before, no model (the rules alone); fed its pods' stats, the what-if
    simulates the profile fitted to them, and status carries the fit and the verdict."""
    engine = make_engine("tensorrt", **A100)
    planner = Planner()
    observed = Observed(kv=replace(full_batch_queueing(), arrival_rate=10.0, prompt_mean=150.0, output_mean=400.0))
    assert engine_model(engine.spec, 1024, restart_seconds=90.0, surge_pods=0) is None
    assert not may_simulate(engine.spec, observed.kv, planner.with_model(engine, observed).model)
    feed(planner, engine, SLOW)
    seen = planner.with_model(engine, observed)
    assert seen.model is not None and seen.model.status.trust == ModelTrust.TRUSTED
    assert may_simulate(engine.spec, seen.kv, seen.model)
    model = engine_model(engine.spec, 1024, restart_seconds=90.0, surge_pods=0, model=seen.model)
    assert model is not None and not isinstance(model.profile, str)
    assert abs(model.profile.calibration.hbm_efficiency - 0.72) < 0.02  # the pods' engine, not the datasheet
    p = planner.plan_inline(engine, seen, Settings(), NOW)
    record = (p.status.autotune or AutotuneStatus()).model
    assert record is not None and record.trust == ModelTrust.TRUSTED and record.known
    cond = p.status.condition(MODEL_TRUSTED)
    assert cond is not None and cond.status == "True" and cond.reason == "ModelCalibrated"
    planner.close()


def serving(engine: Any, kv: Any) -> Observed:
    """What the bench observes of an engine whose pods serve (its cache claim bound, its engine published)."""
    from kvpilot.desired.plan import plan

    fingerprint = plan(engine, Observed(claim_phase="Bound"), Settings(), NOW).fingerprint
    index = {fingerprint: {"fingerprint": fingerprint, "maxBatchSize": 1024, "maxNumTokens": 8192}}
    return Observed(claim_phase="Bound", engine_index=index, kv=kv, startup_seconds=90.0)


def test_a_model_that_disagrees_with_the_pods_turns_the_tuner_to_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpilot.autotune.policy as policy

    def never(*_a: object, **_k: object) -> WhatIf:
        raise AssertionError("a model that disagrees with the pods is not simulated")

    monkeypatch.setattr(policy, "what_if_verdict", never)
    engine = make_engine(runtime__simulation={"profile": "llama-3.1-8b-bf16-a100"}, build__maxBatchSize=1024,
                         serving__replicas=1, **A100)
    planner = Planner()
    feed(planner, engine, SLOW, slow_by=2.5)  # every other window 2.5x slower: no calibration predicts it
    kv = replace(full_batch_queueing(), arrival_rate=20.0, prompt_mean=150.0, output_mean=400.0)
    seen = planner.with_model(engine, serving(engine, kv))
    assert seen.model is not None and seen.model.measured_only
    p = planner.plan_inline(engine, seen, Settings(), NOW)
    cond = p.status.condition(MODEL_TRUSTED)
    assert cond is not None and (cond.status, cond.reason) == ("False", "ModelDisagrees")
    assert "measurements alone" in cond.message
    # The rules alone, in a small step: nothing simulated, even though this engine names a kvsim profile.
    assert p.decision is not None and p.decision.action == "Raise", p.decision
    assert "at most x1.5" in p.decision.message
    planner.close()


def test_the_model_condition_is_retired_when_tuning_is_turned_off() -> None:
    engine = make_engine("tensorrt", **A100)
    planner = Planner()
    feed(planner, engine, SLOW, seconds=60.0)
    on = planner.plan_inline(engine, planner.with_model(engine, Observed(kv=full_batch_queueing())), Settings(), NOW)
    assert on.status.condition(MODEL_TRUSTED) is not None
    off = replace(engine, spec=replace(engine.spec, autotune=replace(engine.spec.autotune, enabled=False)))
    later = planner.plan_inline(off, planner.with_model(off, Observed(status=on.status)), Settings(), NOW)
    assert later.status.condition(MODEL_TRUSTED) is None
    planner.close()


def record(**fields: object) -> ModelStatus:
    base: dict[str, object] = dict(profile="p", known=True, trust=ModelTrust.TRUSTED, hbm_efficiency="0.720",
                                   prefill_mfu="0.525", step_overhead_millis="0.250", per_sequence_micros="1.27",
                                   kv_pool_tokens=460000, iterations=5000, latency_error_percent="0.4",
                                   datasheet_error_percent="17.0", goodput_error_percent="1.0", bound_percent=10,
                                   message="m1")
    return ModelStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_status_is_rewritten_only_when_the_figures_move() -> None:
    old = record()
    assert model_status(old, record(iterations=9000, latency_error_percent="0.9", message="m2")) is old
    assert model_status(old, record(hbm_efficiency="0.722")) is old  # 0.3%: within the 1% hysteresis
    for moved in (record(trust=ModelTrust.DISTRUSTED), record(hbm_efficiency="0.70"), record(kv_pool_tokens=400000),
                  record(goodput_error_percent="2.5"), record(latency_error_percent="1.5")):
        assert model_status(old, moved) is moved
    assert model_status(None, old) is old
    assert model_status(record(hbm_efficiency="not a number"), old) is old  # a hand-edited value is replaced


def test_the_sampler_hands_each_sample_to_the_fit_once() -> None:
    from kvpilot.observe.scrape import EngineFacts, EngineSampler
    from kvpilot.trtllm.metrics import LatencySnapshot

    sampler = EngineSampler(clock=lambda: 1000.0)
    body = b'[{"iter": 5, "iterLatencyMS": 12.0, "numActiveRequests": 8, "kvCacheStats": {"maxNumBlocks": 100, ' \
           b'"usedNumBlocks": 10, "tokensPerBlock": 32}}]'
    sampler.accept("pod-0", 1000.0, body, None, EngineFacts())
    first, _ = sampler.fresh()
    assert [s.iteration for s in first["pod-0"]] == [5]
    assert sampler.fresh()[0] == {}  # the same window read again: nothing new
    sampler.accept("pod-0", 1002.5, body.replace(b'"iter": 5', b'"iter": 9'), None, EngineFacts())
    assert [s.iteration for s in sampler.fresh()[0]["pod-0"]] == [9]
    # The prompts a pod's counters grew by between two feeds (for PyTorch stats without token counts).
    record = sampler.record("pod-0")
    record.latency.append((1003.0, LatencySnapshot(completed=10.0, prompt_tokens=1500.0)))
    sampler.fresh()
    record.latency.append((1005.0, LatencySnapshot(completed=14.0, prompt_tokens=2100.0)))
    _, prompts = sampler.fresh()
    assert (prompts["pod-0"].tokens, prompts["pod-0"].requests) == (600.0, 4.0)
    record.latency.append((1007.0, LatencySnapshot(completed=1.0, prompt_tokens=50.0)))  # a restarted pod
    assert "pod-0" not in sampler.fresh()[1]


def test_status_keeps_no_model_without_iterations() -> None:
    engine = make_engine("tensorrt", **A100)
    planner = Planner()
    p = planner.plan_inline(engine, planner.with_model(engine, Observed(status=EngineStatus())), Settings(), NOW)
    assert (p.status.autotune or AutotuneStatus()).model is None and p.status.condition(MODEL_TRUSTED) is None
    planner.close()


def test_the_goodput_check_runs_once_a_minute_and_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The goodput check (one simulation) feeds only the figure status shows: sampled once a minute, it runs on
    2 of 6 windows 15 s apart, the figure differs from the one checked on every window, and every plan decides
    as when it runs on each window (the bench's path: no CPU budget, which the check no longer spends live)."""
    engine = make_engine("tensorrt", **A100)

    def kv(k: int) -> Any:  # the traffic moves from window to window, as it does live
        return replace(full_batch_queueing(), arrival_rate=10.0 + 2.0 * k, prompt_mean=150.0, output_mean=400.0,
                       completion_rate=8.0 + k, ttft_miss_fraction=0.2, tpot_miss_fraction=0.05)
    calls: list[float] = []
    check = planning.goodput_check

    def counted(*args: Any) -> float | None:
        calls.append(0.0)
        return check(*args)
    monkeypatch.setattr(planning, "goodput_check", counted)

    def plans(check_seconds: float) -> list[tuple[Any, str | None]]:
        monkeypatch.setattr(trust, "GOODPUT_CHECK_SECONDS", check_seconds)
        planner = Planner()
        feed(planner, engine, SLOW)
        out, status = [], EngineStatus()
        for k in range(6):  # as the loop does: each plan reads the status the one before wrote
            observed = replace(serving(engine, kv(k)), status=status)
            p = planner.plan_inline(engine, observed, Settings(), NOW + timedelta(seconds=15 * k))
            status, d = p.status, p.decision
            model = (status.autotune or AutotuneStatus()).model
            out.append(((d.action, d.target, d.reason, CPU.sub("", d.message)) if d else None,
                        model.goodput_error_percent if model else None))
        planner.close()
        return out

    every_window = plans(0.0)
    assert len(calls) == 6 and every_window[0][1] is not None  # the check ran and status shows its figure
    calls.clear()
    sampled = plans(60.0)
    assert len(calls) == 2  # at 0 s and 60 s
    assert [decision for decision, _ in sampled] == [decision for decision, _ in every_window]
    assert all(figure is not None for _, figure in sampled)  # shown between checks too
    assert [figure for _, figure in sampled] != [figure for _, figure in every_window]  # it was sampled: the
    # decisions above are the same although the figure is not
