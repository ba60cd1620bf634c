"""What a raise for gain may pay its restart with (robust.paying_gain, issue 18, docs/tuner-suite.md "Fourteenth
pass"): with surge, the model's whole gain; without surge, the gain left once the model's error is taken off the
candidate, over NO_SURGE_PAYBACK. Figures from the decisions that lost runs without a spare GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvpilot.autotune.robust import NO_SURGE_PAYBACK, paying_gain
from kvpilot.autotune.whatif import Decline, ERROR_EATS_GAIN, Engine, Outcome, WhatIf, choose

NO_SURGE = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict", replicas=2,
                  restart_seconds=90.0, surge=False, ttft_ms=3000.0, tpot_ms=60.0)


def run(goodput: float) -> Outcome:
    return Outcome(goodput, 900.0, 20.0)


def test_with_surge_the_whole_gain_pays() -> None:
    assert paying_gain(8678.0, 26.36, 20.85, 0.15, surge=True) == 8678.0


def test_without_surge_the_error_comes_off_the_candidate_then_the_margin() -> None:
    # The first window of chat on an engine decoding 30% faster than its profile: 20.85 staying at 64, 26.36 at
    # 256 over 1,575 s, a 15% error; 26.36 x 0.85 = 22.41 leaves 1.56 req/s of the 5.51.
    gain = (26.36 - 20.85) * 1575.0
    left = (26.36 * 0.85 - 20.85) * 1575.0
    assert paying_gain(gain, 26.36, 20.85, 0.15, surge=False) == pytest.approx(left / NO_SURGE_PAYBACK)
    assert paying_gain(gain, 26.36, 20.85, 0.15, surge=False, with_error=False) == pytest.approx(
        gain / NO_SURGE_PAYBACK)
    assert paying_gain(gain, 26.36, 20.85, 0.30, surge=False) == 0.0  # the error eats the whole gain
    assert paying_gain(-10.0, 20.0, 21.0, 0.1, surge=False) == -10.0  # no gain: left as it is


def test_a_young_model_declines_what_a_fitted_one_makes() -> None:
    results, stay, lost = {256: run(26.36)}, run(20.85), 4129.0
    gains = {256: (26.36 - 20.85) * 1575.0}  # 8,678: twice what the restart spoils
    assert choose(results, stay, gains, lost, 64, replace(NO_SURGE, model_error=0.03)) == 256
    assert choose(results, stay, gains, lost, 64, replace(NO_SURGE, model_error=0.15)) is None
    assert choose(results, stay, gains, lost, 64, replace(NO_SURGE, model_error=0.15), with_error=False) == 256
    assert choose(results, stay, gains, lost, 64, replace(NO_SURGE, model_error=0.15, surge=True)) == 256


def test_a_thin_payback_without_surge_is_declined() -> None:
    # Document Q&A, 30 s before chat arrived: 7.65 staying at 23, 8.76 at 46 over 1,575 s, against 1,515 good
    # requests the restart spoils (1.15 times over), on a model fitted for 14 minutes.
    results, stay = {46: run(8.76)}, run(7.65)
    gains = {46: (8.76 - 7.65) * 1575.0}
    assert choose(results, stay, gains, 1515.0, 23, replace(NO_SURGE, surge=True)) == 46
    assert choose(results, stay, gains, 1515.0, 23, NO_SURGE) is None


@pytest.mark.parametrize(("raised", "error", "surge", "best", "note"), [
    (26.36, 0.15, False, None, True),  # the decision at 30 s of chat: a young model's error declines it
    (26.36, 0.15, True, 256, False),  # with surge the whole gain pays
    (26.36, 0.04, False, 256, False),  # a settled model: what its error leaves pays 1.5 times over
    (24.80, 0.04, False, None, False),  # a settled model's error declines it: the decline stands
])
def test_verdict_notes_a_decline_by_a_young_models_error_alone(monkeypatch: pytest.MonkeyPatch, raised: float,
                                                               error: float, surge: bool, best: int | None,
                                                               note: bool) -> None:
    """The simulated outcomes stubbed (20.85 good req/s staying at 64, ``raised`` at 256; 4,128 good requests the
    restart spoils): the note that lets the next proposal rerun the simulation comes only without surge and from a
    young model (error above robust.YOUNG_ERROR) whose error alone declined the raise."""
    import kvpilot.autotune.whatif as whatif
    from kvpilot.autotune.window import KvWindow

    goodput = {64: 20.85, 256: raised}
    monkeypatch.setattr(whatif, "_placed", lambda _e, _f, limit, _b: run(goodput[limit]))
    monkeypatch.setattr(whatif, "_slower_runs", lambda *_a: None)
    monkeypatch.setattr(whatif, "_cap_shaky", lambda *_a: None)
    w = KvWindow(samples=60, pods=2, peak_utilization=0.1, mean_utilization=0.08, peak_used_blocks=900,
                 max_blocks=12000, tokens_per_block=32, peak_active=64, mean_active=64.0, peak_queued=23,
                 mean_queued=20.0, paused=0,
                 runtime_batch_size=64, window_seconds=15.0, completion_rate=12.0, arrival_rate=16.15,
                 prompt_mean=148.0, output_mean=518.0)
    e = replace(NO_SURGE, model_error=error, surge=surge)
    chosen, why, decline, _, _ = whatif.verdict(e, w, 64, [256], 198.0, 1800.0)
    assert (chosen, ERROR_EATS_GAIN in why) == (best, note), why
    assert decline == (None if best else Decline.YOUNG_ERROR if note else Decline.NO_GAIN), why


@pytest.mark.parametrize("young", [True, False])
def test_a_decline_the_fit_may_undo_leaves_the_simulation_free_to_rerun(monkeypatch: pytest.MonkeyPatch,
                                                                        young: bool) -> None:
    """A decline records status.autotune.whatIfDeclinedAt, and the policy reruns the simulation only
    RECHECK_SECONDS later; a decline by the model's error alone does not, so the next proposal is simulated on a
    fit that has narrowed (its error fell from 15% to 3.7% in 90 s of chat)."""
    from kvpilot.api.status import status_dict
    from kvpilot.autotune import policy
    from kvpilot.api.status import Action
    from kvpilot.autotune.decision import Decision
    from kvpilot.autotune.reasons import TunerReason
    from kvpilot.desired.observed import Observed
    from kvpilot.desired.plan import plan
    from tests.unit.helpers import engine
    from tests.unit.test_plan import NOW, S, built
    from tests.unit.test_planning import window

    why = "goodput 20.85 staying at 64; 26.36 at 256" + (f"; {ERROR_EATS_GAIN}" if young else "")
    raise_ = Decision(Action.RAISE, 128, TunerReason.QUEUE_WITH_HEADROOM, "q")
    monkeypatch.setattr(policy, "decide_from_signals", lambda *a: raise_)
    monkeypatch.setattr(policy, "what_if_verdict", lambda *a, **_k: WhatIf(None, why, Decline.YOUNG_ERROR if young else Decline.NO_GAIN))
    e = engine(autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 512})
    first = plan(e, Observed(claim_phase="Bound"), S, NOW)
    p = plan(e, replace(built(first), kv=window()), S, NOW)
    assert p.decision is not None and (p.decision.action, p.decision.reason) == ("Hold", "NoPredictedGain")
    declined = status_dict(p.status)["autotune"].get("whatIfDeclinedAt")
    assert (declined is None) == young
