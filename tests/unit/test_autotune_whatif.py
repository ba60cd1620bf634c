"""The tuner's what-if simulation: a fitted traffic replayed on kvsim, staying put vs the candidate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvpilot.autotune.replay import TrafficFit, fit_traffic
from kvpilot.autotune.whatif import Decline, Engine, goodput_after, steady_goodput, verdict
from kvpilot.autotune.window import KvWindow

A100 = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict", replicas=2,
              restart_seconds=90.0, surge=False, ttft_ms=3000.0, tpot_ms=60.0)


def window(rate: float, prompt: float = 150, output: float = 600) -> KvWindow:
    return KvWindow(samples=10, pods=2, peak_utilization=0.3, mean_utilization=0.3, peak_used_blocks=100,
                    max_blocks=14000, tokens_per_block=32, peak_active=64, mean_active=64, peak_queued=10,
                    mean_queued=5, paused=0, runtime_batch_size=64, arrival_rate=rate, prompt_mean=prompt,
                    output_mean=output, length_share=0.2227)


def test_no_traffic_data_means_no_verdict() -> None:
    assert fit_traffic(replace(window(5.0), arrival_rate=0.0)) is None
    assert verdict(A100, replace(window(5.0), prompt_mean=0.0), 64, [128], 10.0, 1800.0) == (
        None, "no traffic fit", Decline.NO_FIT, 0.0, None)


def test_fit_is_the_fleet_rate() -> None:
    fit = fit_traffic(window(5.0))
    assert fit is not None and fit.rate_per_s == 10.0 and fit.max_tokens == pytest.approx(1024, abs=2)


def test_light_traffic_gains_nothing_from_a_raise() -> None:
    best, why, _, _, _ = verdict(A100, window(0.5), 64, [128, 256], 10.0, 1800.0)
    assert best is None, why


def test_a_binding_limit_under_load_pays_and_the_simulation_is_deterministic() -> None:
    fit = TrafficFit(rate_per_s=23.0, prompt_mean=150, output_mean=600, max_tokens=1024)
    stay = steady_goodput(A100, fit, 64)
    move = steady_goodput(A100, fit, 256)
    assert move > 1.1 * stay
    assert steady_goodput(A100, fit, 64) == stay


def test_surge_makes_the_restart_cheaper() -> None:
    fit = TrafficFit(rate_per_s=12.0, prompt_mean=150, output_mean=300, max_tokens=1024)
    no_surge = goodput_after(A100, fit, 64, 128, 300.0)
    surge = goodput_after(replace(A100, surge=True), fit, 64, 128, 300.0)
    assert surge >= no_surge


def test_a_raise_the_limit_does_not_need_loses_to_its_restart() -> None:
    # 12 req/s: 64 already serves every request in time, so the restart is pure cost
    fit = TrafficFit(rate_per_s=12.0, prompt_mean=150, output_mean=600, max_tokens=1024)
    assert steady_goodput(A100, fit, 64) >= 0.99 * fit.rate_per_s
    assert goodput_after(A100, fit, 64, 256, 900.0) < goodput_after(A100, fit, 64, 64, 900.0)


def test_candidates_follow_the_rules_direction_within_bounds() -> None:
    from kvpilot.autotune.ladder import candidates

    assert candidates(64, 96, 8, 1024) == [96, 128, 256, 512]
    assert candidates(64, 96, 8, 200) == [96, 128, 200]
    assert candidates(64, 48, 8, 1024) == [24, 32, 48]  # a lower also halves its target
    # and offers the step between (target / sqrt 2) where the halving ladder has none near it
    assert candidates(2048, 89, 8, 1024) == [44, 63, 89, 1024]
    # a lower for traffic still arriving (autotune/ahead.py) goes deeper: the target over 2 sqrt 2 and over 4
    assert candidates(256, 164, 8, 1024, deeper=True) == [41, 58, 82, 128, 164]
    assert candidates(256, 164, 48, 1024, deeper=True) == [48, 58, 82, 128, 164]  # within the bounds


def test_a_collapsed_limit_is_raised_to_the_best_candidate() -> None:
    best, why, _, _, _ = verdict(A100, window(11.5), 64, [128, 256], 200.0, 1800.0)
    assert best in (128, 256), why


def test_a_steady_traffic_is_simulated_once_per_candidate() -> None:
    from kvpilot.autotune.replay import quantized

    from kvpilot.autotune.whatif import steady_run

    steady_run.cache_clear()
    verdict(A100, window(11.5), 64, [128], 200.0, 1800.0)
    misses = steady_run.cache_info().misses
    # Staying put and the one candidate; where the candidate beats staying put, both again on the slower engine.
    assert misses == (4 if "slower" in verdict(A100, window(11.5), 64, [128], 200.0, 1800.0)[1] else 2)
    verdict(A100, window(11.4), 64, [128], 200.0, 1800.0)  # on the same 2.5% grid step: the same fit
    assert steady_run.cache_info().misses == misses
    assert quantized(fit_traffic(window(11.5))) == quantized(fit_traffic(window(11.4)))  # type: ignore[arg-type]
    assert quantized(fit_traffic(window(11.5))) != quantized(fit_traffic(window(13.0)))  # type: ignore[arg-type]


def test_one_decision_shares_a_budget_of_simulated_requests() -> None:
    from kvpilot.autotune.replay import MAX_REQUESTS
    from kvpilot.autotune.whatif import DECISION_BUDGET_REQUESTS, requests_per_run

    assert requests_per_run(2) == MAX_REQUESTS
    assert requests_per_run(5) * 5 <= DECISION_BUDGET_REQUESTS
    from kvpilot.autotune.whatif import steady_run

    steady_run.cache_clear()
    best, why, _, _, _ = verdict(A100, window(11.5), 64, [128, 256, 512, 1024], 200.0, 1800.0)
    # Staying put and four candidates, each within the share; then the robust choice's replays on the slower
    # engine: staying put and each candidate that beats it, each within the same share; then, for the change
    # chosen, staying put and it with the placed max_tokens one step lower and one higher.
    replayed = why.split("on an engine 20% slower: ")[1].split(";")[0].count(" at ") if "slower" in why else 0
    assert best is not None and "max_tokens placed at" in why
    assert steady_run.cache_info().currsize == 5 + replayed + 4
    assert replayed <= 5


def test_the_choice_within_the_simulations_noise() -> None:
    from kvpilot.autotune.whatif import Outcome, choose

    def run(goodput: float, tpot: float) -> Outcome:
        return Outcome(goodput, 900.0, tpot)

    # The example: equal scores, p95 TPOT rising with the limit towards the 60 ms objective.
    results = {96: run(28.25, 40.0), 128: run(28.08, 44.0), 256: run(28.08, 50.0), 512: run(28.08, 57.0)}
    stay = run(27.18, 35.0)
    gains = {c: 1000.0 for c in results}
    assert choose(results, stay, gains, 500.0, 64, A100) == 96  # the most TPOT margin among equals, not 512
    assert choose(results, stay, gains, 500.0, 64, A100, margin=0.06) is None  # +3.9% does not clear 6%
    assert choose(results, stay, {c: 100.0 for c in results}, 500.0, 64, A100) is None  # the restart costs more
    # Equal margins (within 1 point): the largest, capacity to spare (the fit under-counts long outputs).
    assert choose({128: run(30.0, 30.0), 256: run(30.1, 30.3), 512: run(30.1, 33.0)}, stay,
                  {128: 900.0, 256: 900.0, 512: 900.0}, 500.0, 64, A100) == 256
    lowers = {32: run(10.5, 40.0), 48: run(10.4, 40.0)}
    assert choose(lowers, run(10.0, 40.0), {32: 900.0, 48: 700.0}, 500.0, 64, A100) == 48  # a lower: the mildest


def test_the_models_error_widens_what_counts_as_equal_and_what_must_be_beaten() -> None:
    from kvpilot.autotune.whatif import Outcome, choose

    results = {128: Outcome(30.0, 900.0, 40.0), 256: Outcome(31.2, 900.0, 52.0)}
    stay, gains = Outcome(25.0, 900.0, 30.0), {128: 900.0, 256: 900.0}
    assert choose(results, stay, gains, 100.0, 64, A100) == 256  # an exact model: 256 is 4% better
    # Equals within a 5% error: 128 leaves 33% of the TPOT objective, 256 only 13%.
    assert choose(results, stay, gains, 100.0, 64, replace(A100, model_error=0.05)) == 128
    assert choose(results, stay, gains, 100.0, 64, replace(A100, model_error=0.3)) is None  # +25% is within 30%
    assert choose(results, stay, gains, 100.0, 64, replace(A100, model_error=float("nan"))) is None


def test_margin_on_the_objectives() -> None:
    from kvpilot.autotune.whatif import Outcome

    assert Outcome(1.0, 1500.0, 45.0).margin(A100) == pytest.approx(0.25)  # TPOT 45 of 60 ms binds
    assert Outcome(1.0, 2700.0, 30.0).margin(A100) == pytest.approx(0.1)  # TTFT 2.7 of 3 s binds
    assert Outcome(0.0).margin(A100) == 0.0  # nothing served: no margin
    assert Outcome(1.0, 100.0, 10.0).margin(replace(A100, ttft_ms=math.inf, tpot_ms=math.inf)) == 1.0


def test_bursty_arrivals_keep_the_fitted_rate_when_the_request_cap_binds() -> None:
    """At 200 req/s the 12,000-request cap covers 60 s, not the 180 s asked: the gaps are pinned over those
    60 s (stretching them over 180 s would simulate a third of the load)."""
    from kvpilot.autotune.replay import TrafficFit
    from kvpilot.autotune.replay import replayed_requests as _requests

    for cv in (1.0, 3.0):
        reqs = _requests(TrafficFit(200.0, 500.0, 200.0, 1024, cv), 180.0)
        rate = len(reqs) / reqs[-1].arrival_s
        assert 180 <= rate <= 220, (cv, rate)


def test_a_model_that_cannot_place_a_limit_leaves_the_decision_to_the_rules() -> None:
    """A model whose GPU memory its fit sized too small for some limits: kvsim's memory plan refuses them. A
    candidate it refuses is no candidate; a limit in force it refuses makes the model unusable this pass (the
    rules decide alone), never a traceback out of the tuner."""
    from kvsim import get_profile

    from kvpilot.autotune.gate import model_check
    from kvpilot.autotune.whatif import UNPLACEABLE, unplaceable

    base = get_profile("llama-3.1-8b-bf16-a100")
    small = replace(base, name="small", gpu=replace(base.gpu, memory_bytes=int(base.weights_resident_bytes + 3e9)))
    model = replace(A100, profile=small, ceiling=2048)
    assert unplaceable(model, 8) is None
    refused = unplaceable(model, 2048)
    assert refused is not None and refused.startswith(UNPLACEABLE) and "do not fit" in refused
    best, why, decline, _, _ = verdict(model, window(5.0), 2048, [8, 64], 10.0, 1800.0)
    assert best is None and why.startswith(UNPLACEABLE) and decline == Decline.UNPLACEABLE
    best, why, _, _, _ = verdict(model, window(5.0), 64, [32, 2048], 10.0, 1800.0)
    assert "at 2048" not in why and "at 32" in why
    at_2048 = replace(window(5.0), runtime_batch_size=2048)
    assert (model_check(model, at_2048, rendered=2048) or "").startswith(UNPLACEABLE)
    assert model_check(model, window(5.0), rendered=64) is None


def test_a_decline_says_how_far_staying_put_leads_the_best_candidate() -> None:
    """``WhatIf.lead``: where staying put scores above every candidate, by how much (as the message's figures read
    it); where a candidate scores as well or higher, none (judged.waits_for_settling reads a tie as no verdict)."""
    import re

    best, why, decline, lead, _ = verdict(A100, window(7.0), 64, [32], 200.0, 1800.0)  # 32 queues what 64 serves
    stay = float(re.search(r"goodput ([\d.]+) staying at 64", why).group(1))  # type: ignore[union-attr]
    at_32 = float(re.search(r"([\d.]+) at 32 \(margin", why).group(1))  # type: ignore[union-attr]
    assert best is None and decline == Decline.NO_GAIN and at_32 < stay, why
    assert lead == pytest.approx(1.0 - at_32 / stay, abs=0.002) and lead > 0.05, (lead, why)
    best, why, _, lead, _ = verdict(A100, window(11.5), 64, [128, 256], 200.0, 1800.0)
    assert best is not None and lead == 0.0, why
    best, why, _, lead, _ = verdict(A100, window(5.0), 64, [32], 200.0, 1800.0)  # light: 32 serves it as well
    assert best is None and lead == 0.0, why


def test_a_choice_says_what_share_of_the_traffic_it_is_predicted_to_win() -> None:
    """``WhatIf.gain``: the chosen candidate's goodput above staying put's, over the rate replayed, as the message's
    figures read it (judged.over_read_gain sets it against the model's misreading of the limit in force); None
    where nothing is chosen."""
    import re

    best, why, _, _, gain = verdict(A100, window(11.5), 64, [128, 256], 200.0, 1800.0)
    assert best is not None and gain is not None, why
    rate = float(re.search(r"simulated ([\d.]+) req/s", why).group(1))  # type: ignore[union-attr]
    stay = float(re.search(r"goodput ([\d.]+) staying at 64", why).group(1))  # type: ignore[union-attr]
    chosen = float(re.search(rf"([\d.]+) at {best} \(margin", why).group(1))  # type: ignore[union-attr]
    assert gain == pytest.approx((chosen - stay) / rate, abs=0.002) and gain > 0.05, (gain, why)
    best, why, _, _, gain = verdict(A100, window(7.0), 64, [32], 200.0, 1800.0)
    assert best is None and gain is None, why
    # for a lower, the one change judged.over_read_gain reads it for: tests/unit/test_autotune_robust_choice.py
