"""Whether the tuner trusts its engine model (autotune/trust.py): the bound, the hysteresis, status and condition."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from kvsim import Engine, get_profile

from kvpilot.api.status import AutotuneStatus, EngineStatus, ModelTrust, parse_status, status_dict
from kvpilot.api.status_schema import DECIMAL
from kvpilot.autotune.engine_model import BaseModel
from kvpilot.autotune.trust import (
    GOODPUT_CHECK_SECONDS,
    MODEL_ERROR_BOUND,
    ModelMonitor,
    Trust,
    goodput_error,
    model_condition,
)
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.whatif import sim_config
from kvpilot.trtllm.metrics import parse_iteration_stats
from tests.unit.test_calibrate import A100, SLOW, sample, serve, traffic

KNOWN = BaseModel(A100, True, "kvsim profile llama-3.1-8b-bf16-a100")


def test_a_slower_engine_is_calibrated_then_trusted() -> None:
    monitor = ModelMonitor(KNOWN)
    assert monitor.trust().state == ModelTrust.CALIBRATING
    assert model_condition(monitor.trust()).status == "Unknown"
    serve(SLOW, monitor)
    assert monitor.trust().state == ModelTrust.TRUSTED  # by its latency alone (no model check yet)
    monitor.note_goodput_error(0.01)
    trust = monitor.trust()
    assert trust.state == ModelTrust.TRUSTED and not trust.measured_only, trust.message
    assert trust.model_error < 0.03
    cond = model_condition(trust)
    assert (cond.type, cond.status, cond.reason) == ("ModelTrusted", "True", "ModelCalibrated")
    assert "datasheet" in cond.message  # the figures: the fit's error and the datasheet's
    view = monitor.view()
    assert view.fit is not None and not view.measured_only and view.status.trust == ModelTrust.TRUSTED
    profile = view.profile(1024, "GuaranteedNoEvict")
    assert profile is not None and profile.calibration.hbm_efficiency == pytest.approx(0.72, rel=0.02)
    # A steady fit keeps handing the same fit (so the same profile: the what-if's memo hits).
    serve(SLOW, monitor, seconds=60.0, start=240.0)
    assert monitor.held() is view.fit
    assert monitor.view().profile(1024, "GuaranteedNoEvict") == profile


def test_status_carries_the_fit_and_reads_back() -> None:
    monitor = ModelMonitor(KNOWN)
    serve(SLOW, monitor)
    monitor.note_goodput_error(-0.02)
    model = monitor.status("2026-01-01T00:00:00Z")
    assert model.trust == ModelTrust.TRUSTED and model.known and model.bound_percent == 10
    assert model.hbm_efficiency is not None and float(model.hbm_efficiency) == pytest.approx(0.72, rel=0.02)
    assert model.kv_pool_tokens and model.kv_pool_tokens > 100_000
    assert model.goodput_error_percent == "-2.0"
    for value in (model.hbm_efficiency, model.prefill_mfu, model.step_overhead_millis, model.per_sequence_micros,
                  model.latency_error_percent, model.datasheet_error_percent, model.goodput_error_percent):
        assert value is not None and re.match(DECIMAL, value), value
    status = EngineStatus(autotune=AutotuneStatus(model=model))
    assert parse_status(status_dict(status)) == status


def test_a_model_off_by_more_than_the_bound_is_distrusted_until_well_within_it() -> None:
    """A pod whose every other window runs 2.5x slower than any calibration predicts pushes the running latency
    error past 10%; once it behaves, the error comes down, and trust comes back only below 7% (hysteresis)."""
    monitor = ModelMonitor(KNOWN)
    pod = Engine(sim_config(SLOW, 1024, 64, "GuaranteedNoEvict"))
    pending = traffic(15.0, 1800.0)
    seen: list[tuple[float | None, ModelTrust]] = []
    for w in range(1, 120):
        t = 15.0 * w
        while pending and pending[0].arrival_s <= t:
            pod.submit(pending.pop(0))
        pod.advance_to(t)
        odd = 16 <= w < 24 and w % 2
        stats = [{**x, "iterLatencyMS": x["iterLatencyMS"] * (2.5 if odd else 1.0)} for x in pod.drain_iteration_stats()]
        monitor.observe({"p": parse_iteration_stats(stats, t)}, t, 64)
        trust = monitor.trust()
        seen.append((trust.latency_error, trust.state))
        if w == 23:
            assert trust.state == ModelTrust.DISTRUSTED and trust.measured_only, trust.message
            assert model_condition(trust).status == "False" and model_condition(trust).reason == "ModelDisagrees"
            assert "measurements alone" in trust.message
    after = seen[23:]
    assert any(0.07 <= (e or 0) <= MODEL_ERROR_BOUND for e, _ in after)  # it crossed the band...
    assert all(state == ModelTrust.DISTRUSTED for e, state in after if (e or 0) >= 0.07)  # ...still distrusted
    assert after[-1][1] == ModelTrust.TRUSTED  # and is trusted again


def test_the_whatifs_goodput_error_is_shown_but_does_not_decide() -> None:
    monitor = ModelMonitor(KNOWN)
    serve(SLOW, monitor)
    for _ in range(6):
        monitor.note_goodput_error(0.4)  # the traffic fit's bias (long outputs under-counted), not the engine's
    trust = monitor.trust()
    assert trust.state == ModelTrust.TRUSTED and trust.goodput_error is not None and trust.goodput_error > 0.3
    assert trust.model_error < 0.03 and "traffic fit included" in trust.message


def test_an_engine_the_model_cannot_describe_is_distrusted_by_its_latency() -> None:
    """Iterations twice or half as long from one window to the next with nothing else changing: no calibration
    predicts them, and the running error says so."""
    monitor = ModelMonitor(KNOWN)
    for w in range(12):
        latency = 28.0 if w % 2 else 9.0
        samples = [sample(iteration=w * 100 + i, iter_latency_ms=latency, used_blocks=400 + i) for i in range(60)]
        monitor.observe({"p": samples}, 15.0 * w, 64)
    trust = monitor.trust()
    assert trust.latency_error is not None and trust.latency_error > MODEL_ERROR_BOUND
    assert trust.state == ModelTrust.DISTRUSTED


def test_an_engine_without_a_profile_gets_one_once_fitted() -> None:
    template = BaseModel(replace(A100, name="template", gpu=get_profile("llama-3.1-8b-bf16-h100").gpu), False, "t")
    monitor = ModelMonitor(template)
    assert monitor.view().profile(1024, "GuaranteedNoEvict") is None  # before the fit: the rules alone, as before
    serve(SLOW, monitor)
    profile = monitor.view().profile(1024, "GuaranteedNoEvict")
    assert profile is not None and profile.name.endswith("-calibrated")
    assert monitor.status(None).weight_stream_scale is not None and monitor.status(None).known is False


def window(**fields: object) -> KvWindow:
    base: dict[str, object] = dict(samples=10, pods=2, peak_utilization=0.3, mean_utilization=0.3,
                                   peak_used_blocks=100, max_blocks=14000, tokens_per_block=32, peak_active=64,
                                   mean_active=64, peak_queued=10, mean_queued=5, paused=0, runtime_batch_size=64,
                                   arrival_rate=10.0, completion_rate=9.0, ttft_miss_fraction=0.1,
                                   tpot_miss_fraction=0.05)
    return KvWindow(**{**base, **fields})  # type: ignore[arg-type]


def test_goodput_error_is_a_share_of_the_offered_traffic() -> None:
    # 2 pods: 20 req/s offered, 18 finished, 90% of them good: 16.2 measured
    assert goodput_error(18.2, window()) == pytest.approx(0.1)
    assert goodput_error(16.2, window()) == pytest.approx(0.0)
    assert goodput_error(10.0, window(ttft_miss_fraction=None, tpot_miss_fraction=None)) is None  # no histograms
    assert goodput_error(10.0, window(arrival_rate=0.0)) is None
    assert goodput_error(float("nan"), window()) is None


def test_hostile_goodput_errors_are_bounded_or_ignored() -> None:
    monitor = ModelMonitor(KNOWN)
    monitor.note_goodput_error(float("nan"))
    monitor.note_goodput_error(float("inf"))
    assert monitor.trust().goodput_error is None
    monitor.note_goodput_error(1e9)
    assert monitor.trust().goodput_error == 1.0


def test_no_model_yet_is_unknown() -> None:
    cond = model_condition(None)
    assert (cond.status, cond.reason) == ("Unknown", "ModelCalibrating")
    assert Trust(ModelTrust.CALIBRATING, "x").model_error == 0.0


def test_the_goodput_check_is_due_once_a_minute_and_when_the_limit_moves() -> None:
    """Due before any check; then GOODPUT_CHECK_SECONDS after the last one noted, or at once when the limit in
    force moved (status says the figure is at that limit). A window with nothing to compare (None, NaN) does not
    restart the wait, and a clock that went back is due at once."""
    monitor = ModelMonitor(KNOWN)
    assert monitor.goodput_check_due(1000.0, 64)
    monitor.note_goodput_error(None, 1000.0, 64)
    assert monitor.goodput_check_due(1015.0, 64)  # nothing was compared: check the next window
    monitor.note_goodput_error(0.05, 1015.0, 64)
    assert not monitor.goodput_check_due(1015.0, 64)
    assert not monitor.goodput_check_due(1015.0 + GOODPUT_CHECK_SECONDS - 1, 64)
    assert monitor.goodput_check_due(1015.0 + GOODPUT_CHECK_SECONDS, 64)
    assert monitor.goodput_check_due(1030.0, 128)  # a change rolled: the figure at 64 no longer describes it
    assert monitor.goodput_check_due(900.0, 64)  # the clock went back
    monitor.note_goodput_error(float("nan"), 2000.0, 64)  # hostile: ignored, the wait still counts from 1015
    assert not monitor.goodput_check_due(1016.0, 64)
    assert monitor.trust().goodput_error == pytest.approx(0.05)
    monitor.note_goodput_error(0.01)  # no time given: the figure moves, the wait stays as it was
    assert not monitor.goodput_check_due(1016.0, 64) and monitor.trust().goodput_error != pytest.approx(0.05)
