"""The engine fit (autotune/calibrate.py): kvsim's stats of a perturbed engine, fitted from the nominal profile.

The pods here are kvsim engines whose calibration differs from the profile the fit starts from; their
``/metrics`` is parsed by the operator's parser, as the sampler does. Hostile samples are built directly.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from kvsim import Engine, Profile, Request, get_profile

from kvpilot.autotune.calibrate import EngineFit, PromptWork, WindowCheck
from kvpilot.autotune.iterations import MAX_PODS, MAX_POOLS
from kvpilot.autotune.trust import ModelMonitor
from kvpilot.autotune.whatif import sim_config
from kvpilot.trtllm.metrics import IterationSample, parse_iteration_stats

A100 = get_profile("llama-3.1-8b-bf16-a100")
SLOW = replace(A100, calibration=replace(A100.calibration, hbm_efficiency=0.72, per_sequence_s=1.875e-6))


def traffic(rate: float, seconds: float, seed: int = 3) -> list[Request]:
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(Request(prompt_tokens=max(1, int(rng.lognormvariate(math.log(150), 0.6))),
                           output_tokens=max(1, int(rng.lognormvariate(math.log(400), 0.6))), max_tokens=1024,
                           arrival_s=t, request_id=len(out)))


def serve(profile: Profile, fit: EngineFit | ModelMonitor, seconds: float = 240.0, limit: int = 64, pytorch: bool = False,
          rate: float = 15.0, start: float = 0.0) -> list[WindowCheck]:
    """One kvsim pod at ``limit`` under Poisson traffic; its /metrics drained into the fit every 15 s."""
    engine = Engine(sim_config(profile, 1024, limit, "GuaranteedNoEvict"))
    checks = []
    pending = traffic(rate, seconds)
    t = 15.0
    while t <= seconds:
        while pending and pending[0].arrival_s <= t:
            engine.submit(pending.pop(0))
        engine.advance_to(t)
        stats: list[dict[str, Any]] = engine.drain_iteration_stats()
        if pytorch:
            stats = [{**s, "inflightBatchingStats": {}, "maxBatchSizeRuntime": 0} for s in stats]
        done = engine.pop_finished()
        work = {"p": PromptWork(float(sum(r.prompt_tokens for r in done)), float(len(done)))} if pytorch else None
        checks.append(fit.observe({"p": parse_iteration_stats(stats, start + t)}, start + t, limit, work))
        t += 15.0
    return checks


def test_the_fit_finds_a_slower_engine_and_predicts_its_latency() -> None:
    fit = EngineFit(A100)
    checks = serve(SLOW, fit)
    first, last = checks[0].nominal_error, checks[-1].error
    assert first is not None and first < -0.12  # the datasheet is ~17% too fast for this engine
    assert last is not None and abs(last) < 0.01  # the fit predicts the next window within 1%
    result = fit.result()
    assert result.ready and result.per_token
    assert result.calibration.hbm_efficiency == pytest.approx(0.72, rel=0.02)
    assert result.latency_error is not None and result.latency_error < 0.03
    assert result.nominal_error is not None and result.nominal_error > 0.12
    assert result.pool_tokens[-1][0] == 64  # the pool at the limit in force, as the pods report it


def test_the_nominal_engine_keeps_the_datasheet() -> None:
    fit = EngineFit(A100)
    serve(A100, fit)
    cal = fit.result().calibration
    assert cal.hbm_efficiency == pytest.approx(0.9, rel=0.01)
    assert cal.prefill_mfu == pytest.approx(0.525, rel=0.05)


def test_pytorch_stats_without_token_counts_still_fit() -> None:
    fit = EngineFit(A100)
    checks = serve(SLOW, fit, pytorch=True)
    result = fit.result()
    assert not result.per_token
    assert checks[-1].error is not None and abs(checks[-1].error) < 0.05
    assert result.calibration.hbm_efficiency == pytest.approx(0.72, rel=0.05)
    assert result.pool_tokens[-1][0] == 64  # the caller's limit: PyTorch reports maxBatchSizeRuntime 0


def test_a_template_fits_an_engine_on_another_gpu() -> None:
    """No kvsim profile: the template (H100) fitted to an A100 pod's stats, weight stream freed."""
    template = replace(A100, name="template", gpu=get_profile("llama-3.1-8b-bf16-h100").gpu)
    fit = EngineFit(template, known=False)
    checks = serve(SLOW, fit)
    assert checks[0].nominal_error is not None and checks[0].nominal_error < -0.3
    assert checks[-1].error is not None and abs(checks[-1].error) < 0.02


def test_a_template_ten_times_off_still_learns_from_every_iteration() -> None:
    """An L4 pod (300 GB/s) fitted from the H100 template (3.35 TB/s): every latency is ~10x what the template
    predicts, which is the engine, not hostile samples (those are judged against the window's other ones)."""
    l4 = get_profile("llama-3.1-8b-fp8-l4")
    template = replace(l4, name="template", gpu=get_profile("llama-3.1-8b-fp8-h100").gpu)
    fit = EngineFit(template, known=False)
    checks = serve(l4, fit, rate=1.5)
    assert checks[0].nominal_error is not None and checks[0].nominal_error < -0.8
    assert checks[-1].rejected == 0
    assert checks[-1].error is not None and abs(checks[-1].error) < 0.03


def sample(**fields: Any) -> IterationSample:
    base: dict[str, Any] = dict(timestamp_s=0.0, used_blocks=500, max_blocks=14000, tokens_per_block=32,
                                active_requests=64, queued_requests=0, paused_requests=0,
                                max_batch_size_runtime=64, max_batch_size_static=1024, iter_latency_ms=14.0,
                                generation_requests=64, scheduled_requests=64, iteration=1)
    return IterationSample(**{**base, **fields})


def test_hostile_samples_are_dropped_and_change_nothing() -> None:
    clean, dirty = EngineFit(A100), EngineFit(A100)
    serve(SLOW, clean)
    serve(SLOW, dirty)
    before = dirty.result().calibration
    hostile = [sample(iter_latency_ms=math.nan, iteration=10**6), sample(iter_latency_ms=math.inf),
               sample(iter_latency_ms=-5.0), sample(used_blocks=-3), sample(iter_latency_ms=14000.0),
               sample(iteration=10**12, iter_latency_ms=1e5), sample(iteration=0), sample(generation_requests=-1)]
    check = dirty.observe({"p": hostile}, 500.0, 64)
    assert check.rejected >= 7
    after = dirty.result().calibration
    assert after.hbm_efficiency == pytest.approx(before.hbm_efficiency, rel=0.01)
    assert after.per_sequence_s == pytest.approx(before.per_sequence_s, rel=0.05)
    # A clock that goes back or is not a number decays nothing and breaks nothing.
    dirty.observe({"p": []}, math.nan, 64)
    dirty.observe({"p": []}, -1e9, 64)
    assert dirty.result().iterations == pytest.approx(clean.result().iterations, rel=0.2)


def test_a_restarted_pod_starts_its_iteration_chain_again() -> None:
    fit = EngineFit(A100)
    fit.observe({"p": [sample(iteration=1000), sample(iteration=1001)]}, 1.0, 64)
    # iter back to 5 (a new pod behind the same name): weight 1, not 10**9 - 1000
    check = fit.observe({"p": [sample(iteration=5)]}, 2.0, 64)
    assert check.iterations == 1.0


def test_memory_is_bounded_whatever_the_pods_and_limits() -> None:
    fit = EngineFit(A100)
    for w in range(40):
        pods = {f"pod-{w}-{i}": [sample(max_batch_size_runtime=8 + w * 3 + i, iteration=w)] for i in range(10)}
        fit.observe(pods, float(w), 64)
    assert len(fit.reader._last_iter) <= MAX_PODS
    assert len(fit.reader._pools) <= MAX_POOLS
    assert len(fit.result().pool_tokens) <= MAX_POOLS


def test_an_idle_engine_is_not_fitted() -> None:
    fit = EngineFit(A100)
    check = fit.observe({"p": [sample(active_requests=0, generation_requests=0, scheduled_requests=0,
                                      iter_latency_ms=0.0)]}, 1.0, 64)
    assert check.iterations == 0 and check.error is None
    result = fit.result()
    assert not result.ready and result.calibration == A100.calibration


def test_old_evidence_decays_so_the_fit_follows_a_changed_engine() -> None:
    fit = EngineFit(A100, half_life_s=120.0)
    serve(A100, fit, seconds=240.0)
    serve(SLOW, fit, seconds=600.0, start=240.0)
    assert fit.result().calibration.hbm_efficiency == pytest.approx(0.72, rel=0.03)


def test_the_pool_is_labelled_by_the_configured_limit_not_the_in_engine_tuners_value() -> None:
    """The pool is carved at load for maxBatchSizeStatic; with the in-engine tuner on, maxBatchSizeRuntime moves
    below it. Labelled by the runtime value, a 2048 engine's small pool read as the pool at 8 sized the model's
    memory too small to place 2048 at all (the suite's longctx-maxutil-l4 from 2048 stopped on it)."""
    fit = EngineFit(A100)
    samples = [sample(iteration=i, timestamp_s=float(i), max_batch_size_runtime=40, max_batch_size_static=2048,
                      max_blocks=3000) for i in range(1, 40)]
    fit.observe({"p": samples}, 40.0, 2048, None)
    pools = fit.result().pool_tokens
    assert pools and pools[-1] == (2048, 3000 * 32)
