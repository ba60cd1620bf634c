"""The engine the what-if simulates (autotune/engine_model.py): which profile, and the fit put into it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvsim import Calibration, Engine, get_profile
from kvsim.latency import IterationModel
from kvsim.memory import plan_memory

from kvpilot.autotune.calibrate import FitResult
from kvpilot.autotune.engine_model import (
    BaseModel,
    _with_weight_stream,
    base_model,
    calibrated_profile,
    memory_for_pool,
)
from kvpilot.autotune.whatif import sim_config
from tests.unit.helpers import engine


def fit(**fields: object) -> FitResult:
    base: dict[str, object] = dict(calibration=Calibration(0.72, 0.5, 3e-4, 2e-6), weights_scale=1.0,
                                   pool_tokens=((64, 300_000),), tokens_per_block=32, iterations=1e4, windows=20,
                                   latency_error=0.01, nominal_error=0.17, per_token=True)
    return FitResult(**{**base, **fields})  # type: ignore[arg-type]


def test_the_simulated_backend_names_its_profile() -> None:
    model = base_model(engine().spec)
    assert model.known and model.profile == get_profile("llama-3.1-8b-fp8-h100")


def test_a_real_engine_kvsim_knows_gets_its_profile() -> None:
    spec = engine("tensorrt", serving__gpuProduct="NVIDIA-A100-SXM4-80GB").spec
    model = base_model(spec)
    assert model.known, model.source
    assert (model.profile.model.name, model.profile.gpu.name, model.profile.dtype) == ("llama-3.1-8b", "a100", "bf16")
    fp8 = base_model(engine("tensorrt", build__quantization="fp8", build__kvCacheDtype="fp8").spec)
    assert fp8.known and fp8.profile.dtype == "fp8" and fp8.profile.gpu.name == "h100"
    tp2 = base_model(engine("pytorch", model__source="hf://meta-llama/Llama-3.3-70B-Instruct",
                            build__tensorParallelSize=2).spec)
    assert tp2.known and tp2.profile.model.name == "llama-3.1-70b" and tp2.profile.tp == 2


@pytest.mark.parametrize("overrides", [
    {"serving__gpuProduct": "NVIDIA-B200"},  # a GPU kvsim does not know
    {"model__source": "hf://Qwen/Qwen2.5-32B-Instruct", "model__architecture": "qwen"},  # a model it does not know
    {"build__quantization": "int4_awq"},  # a precision it does not model
])
def test_an_engine_kvsim_does_not_know_gets_a_template(overrides: dict[str, str]) -> None:
    model = base_model(engine("tensorrt", **overrides).spec)
    assert not model.known, model.source
    assert "template" in model.source
    # Once fitted, kvsim can simulate it, with the pods' pool (even where the template's weights alone would not
    # fit the template GPU: the memory is sized from the pool the pods report).
    fitted = calibrated_profile(model, fit(), 1024, "GuaranteedNoEvict")
    assert Engine(sim_config(fitted, 1024, 64, "GuaranteedNoEvict")).memory.kv_tokens == pytest.approx(300_000, abs=32)


def test_the_template_for_a_32b_model_is_the_nearest_size() -> None:
    model = base_model(engine("tensorrt", model__source="hf://Qwen/Qwen2.5-32B-Instruct",
                              model__architecture="qwen", build__tensorParallelSize=2).spec)
    assert model.profile.model.name == "llama-3.1-70b" and model.profile.tp == 2


@pytest.mark.parametrize("profile", ["llama-3.1-8b-bf16-a100", "llama-3.1-8b-fp8-l4", "llama-3.1-70b-fp8-h100-tp2"])
@pytest.mark.parametrize("limit", [64, 512])
def test_memory_for_pool_inverts_kvsims_memory_plan(profile: str, limit: int) -> None:
    p = get_profile(profile)
    want = int(plan_memory(p, 1024, 8192, 32, 0.9, runtime_max_batch_size=64).kv_tokens * 0.8)
    memory = memory_for_pool(p, 1024, limit, want, "GuaranteedNoEvict")
    assert memory is not None
    cfg = sim_config(replace(p, gpu=replace(p.gpu, memory_bytes=memory)), 1024, limit, "GuaranteedNoEvict")
    assert Engine(cfg).memory.kv_tokens == pytest.approx(want, abs=32)
    assert memory_for_pool(p, 1024, limit, 0, "GuaranteedNoEvict") is None


def test_the_calibrated_profile_carries_the_fit_and_the_pods_pool() -> None:
    base = BaseModel(get_profile("llama-3.1-8b-bf16-a100"), True, "test")
    p = calibrated_profile(base, fit(), 1024, "GuaranteedNoEvict")
    assert p.calibration.hbm_efficiency == pytest.approx(0.72, rel=0.01)
    assert p.calibration.per_sequence_s == pytest.approx(2e-6, rel=0.01)
    assert Engine(sim_config(p, 1024, 64, "GuaranteedNoEvict")).memory.kv_tokens == pytest.approx(300_000, abs=32)
    # A larger limit carves more per-slot buffers first: a smaller pool.
    assert Engine(sim_config(p, 1024, 1024, "GuaranteedNoEvict")).memory.kv_tokens < 300_000
    # On the grid: a fit that barely moved is the same profile (the what-if's memo hits), one that moved is not.
    cal = p.calibration  # values on the grid: a nudge of 0.03% stays within their cell (half a cell is 0.1%)
    def moved(factor: float) -> FitResult:
        return fit(calibration=Calibration(cal.hbm_efficiency * factor, cal.prefill_mfu * factor,
                                           cal.step_overhead_s * factor, cal.per_sequence_s * factor))
    assert calibrated_profile(base, moved(1.0003), 1024, "GuaranteedNoEvict") == p
    assert calibrated_profile(base, moved(1.01), 1024, "GuaranteedNoEvict") != p


def test_a_template_gets_the_fitted_weight_stream() -> None:
    template = get_profile("llama-3.1-8b-bf16-h100")
    scaled = _with_weight_stream(template, 2.0)
    before, after = IterationModel.for_profile(template, 32), IterationModel.for_profile(scaled, 32)
    assert after.weights_s == pytest.approx(2 * before.weights_s, rel=0.01)
    assert after.linear_s_per_token == pytest.approx(before.linear_s_per_token, rel=0.01)
    assert after.kv_s_per_token == before.kv_s_per_token
    base = BaseModel(template, False, "template")
    p = calibrated_profile(base, fit(weights_scale=2.0), 1024, "GuaranteedNoEvict")
    assert p.model.intermediate_size > template.model.intermediate_size
    known = calibrated_profile(replace(base, known=True), fit(weights_scale=2.0), 1024, "GuaranteedNoEvict")
    assert known.model == template.model  # a known profile's weights are its own
