"""The limit that does not bind still costs KV blocks, and the what-if plays the pods' in-engine tuner.

* Where requests miss TTFT because admission waits on KV blocks while the batch runs far below the limit, the rules
  propose a lower to twice that batch (``rules._free_slots``): each unused slot's runtime buffers go back to the pool.
  It is no protective change: the what-if may veto it, and without a what-if the tuner holds as before.
* The what-if simulates TensorRT-LLM's in-engine batch-size tuner where the pods run it (``gate.engine_model``):
  without it the model predicted batches the pods never ran.
Measured on the suite (docs/tuner-suite.md): from TensorRT-LLM's default 2048, an L40S decoding 30% off its profile
ran ~290 requests and let a fifth miss TTFT, where 512 served 13% more.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvpilot.api.models import SloSpec
from kvpilot.autotune.gate import WhatIfGate, at_runtime_cap, engine_model
from kvpilot.autotune.inputs import TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.rules import decide_from_signals
from kvpilot.autotune.whatif import Decline, WhatIf, _config, sim_config
from kvpilot.autotune.window import KvWindow
from tests.unit.helpers import engine as make_engine
from tests.unit.test_autotune_policy import SPEC, inp, window
from tests.unit.test_autotune_rollback import MODEL

SLO = replace(SPEC, slo=SloSpec(3000, 60), max_batch_size=2048)


def waiting_for_blocks(active: int = 290) -> KvWindow:
    """A fifth of the requests miss TTFT; the batch runs ``active`` requests, far below 2048; TPOT is fine."""
    return replace(window(util=0.35, active=active, queued=0.0, tpot=34.0), ttft_miss_fraction=0.2,
                   tpot_miss_fraction=0.0, ttft_p95_ms=1540.0, mean_unscheduled=0.0, arrival_rate=18.0,
                   prompt_mean=156.0, output_mean=531.0)


def at_2048(**kw: object) -> TunerInput:
    return inp(current=2048, ceiling=2048, spec=SLO, w=waiting_for_blocks(), replicas=2, **kw)


def test_with_a_what_if_the_rules_propose_a_lower_to_twice_the_running_batch() -> None:
    tuner = at_2048(what_if=WhatIfGate(model=MODEL))
    assert tuner.window is not None
    d = decide_from_signals(tuner, tuner.window, 8, 2048)
    assert (d.action, d.reason, d.target) == ("Lower", "ReservationBound", math.ceil(290 * 2)), d.message
    assert "holds buffers the pool could use" in d.message


def test_the_lower_goes_no_lower_than_the_floor_and_is_judged_as_a_step_from_there() -> None:
    floor = replace(SLO, min_batch_size=1200)
    tuner = replace(at_2048(what_if=WhatIfGate(model=MODEL)), spec=floor)
    assert tuner.window is not None
    d = decide_from_signals(tuner, tuner.window, 1200, 2048)
    assert (d.action, d.reason, d.target) == ("Lower", "ReservationBound", 1200), d.message
    high = replace(tuner, spec=replace(SLO, min_batch_size=1800))  # 2048 -> 1800 is no real step
    d = decide_from_signals(high, tuner.window, 1800, 2048)
    assert (d.action, d.reason) == ("Hold", "ReservationBound"), d.message


@pytest.mark.parametrize("why", ["no batch ran", "the engine evicts (MaxUtilization): no blocks are reserved"])
def test_no_lower_without_a_running_batch_or_under_an_evicting_policy(why: str) -> None:
    if why == "no batch ran":
        tuner = inp(current=2048, ceiling=2048, spec=SLO, w=waiting_for_blocks(active=0), replicas=2,
                    what_if=WhatIfGate(model=MODEL))
    else:
        tuner = replace(at_2048(what_if=WhatIfGate(model=MODEL)), scheduler_policy="MaxUtilization")
    assert tuner.window is not None
    d = decide_from_signals(tuner, tuner.window, 8, 2048)
    assert d.action == "Hold", (why, d.message)


def test_without_a_what_if_nothing_can_say_what_the_lower_frees_and_the_tuner_holds() -> None:
    d = decide(at_2048())
    assert (d.action, d.reason) == ("Hold", "ReservationBound"), d.message


def test_a_batch_near_the_limit_has_no_unused_slots_worth_a_restart() -> None:
    tuner = inp(current=512, ceiling=2048, spec=SLO, w=waiting_for_blocks(active=290), what_if=WhatIfGate(model=MODEL))
    d = decide_from_signals(tuner, tuner.window, 8, 2048)
    assert (d.action, d.reason) == ("Hold", "ReservationBound"), d.message  # 580 is no lower from 512


def test_the_what_if_may_veto_the_lower_it_is_not_protective(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpilot.autotune.policy as policy

    tried: list[list[int]] = []

    def verdict(_model: object, _w: object, _current: int, options: list[int], *_a: object, **_k: object):
        tried.append(options)
        return WhatIf(None, "goodput 36.81 staying at 2048", Decline.NO_GAIN)

    monkeypatch.setattr(policy, "what_if_verdict", verdict)
    d = decide(at_2048(what_if=WhatIfGate(model=MODEL)))
    assert (d.action, d.reason) == ("Hold", "NoPredictedGain"), d.message
    assert tried and 580 in tried[0] and all(c < 2048 for c in tried[0])
    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: WhatIf(1024, "1024 serves most"))
    d = decide(at_2048(what_if=WhatIfGate(model=MODEL)))
    assert (d.action, d.target) == ("Lower", 1024), d.message
    # With the what-if budget spent nothing can judge it, and it is not proposed.
    d = decide(at_2048(what_if=WhatIfGate(model=MODEL, budget_left=False)))
    assert (d.action, d.reason) == ("Hold", "ReservationBound"), d.message


def test_the_what_if_plays_the_in_engine_tuner_where_the_pods_run_it() -> None:
    on = make_engine(autotune={"mode": "Auto"})
    assert on.spec.batching.dynamic_batch_size_tuning  # the schema's default
    model = engine_model(on.spec, 1024, restart_seconds=60.0, surge_pods=0)
    assert model is not None and model.in_engine_tuner
    off = make_engine(autotune={"mode": "Auto"}, batching={"dynamicBatchSizeTuning": False})
    model_off = engine_model(off.spec, 1024, restart_seconds=60.0, surge_pods=0)
    assert model_off is not None and not model_off.in_engine_tuner
    assert sim_config("llama-3.1-8b-bf16-a100", 1024, 512, "GuaranteedNoEvict", "tensorrt", True).enable_batch_size_tuning
    assert _config(model, 512).enable_batch_size_tuning and not _config(model_off, 512).enable_batch_size_tuning
    # The checks against the pods simulate the cap the pods ran (the in-engine tuner's own): without the tuner,
    # which would cap it again.
    assert not at_runtime_cap(model).in_engine_tuner and at_runtime_cap(model_off) is model_off
    # TensorRT-LLM has no in-engine tuner on PyTorch (kvsim refuses it): the flag never reaches that backend.
    assert not sim_config("llama-3.1-8b-bf16-a100", 1024, 512, "GuaranteedNoEvict", "pytorch",
                          True).enable_batch_size_tuning
