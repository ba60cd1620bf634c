"""Do no harm (issue 8): partial windows, no return to a value left within the horizon, one reversal per
horizon, protective lowers sized from the batch that runs, and the what-if gate's budget. Split from
test_autotune_policy.py, whose builders (``inp``, ``window``) these tests share."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from kvpilot.api.models import SloSpec
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.inputs import AppliedChange
from kvpilot.autotune.policy import decide
from kvpilot.autotune.whatif import WhatIf

from tests.unit.test_autotune_policy import NOW, SLO_SPEC, SPEC, inp, slo_window, window


# -- do no harm (issue 8) --------------------------------------------------------------------------------------


def test_a_partial_window_holds() -> None:
    d = decide(inp(expected_pods=4, w=replace(window(util=0.30, active=64, queued=20), pods=3)))
    assert (d.action, d.reason) == ("Hold", "PartialSignals")
    d = decide(inp(expected_pods=4, w=replace(window(util=0.30, active=64, queued=20), pods=4)))
    assert d.action == "Raise"


def test_no_return_to_a_value_left_within_the_horizon() -> None:
    # raised 64 -> 128 twenty minutes ago; paused requests would lower to 64: that is A->B->A
    raised = (AppliedChange(NOW - timedelta(minutes=20), 64, 128),)
    d = decide(inp(current=128, recent_changes=raised, w=window(util=0.80, active=128, paused=3)))
    assert (d.action, d.reason) == ("Hold", "WouldOscillate"), d.message
    # the same evidence after the horizon may lower
    old = (AppliedChange(NOW - timedelta(hours=2), 64, 128),)
    d = decide(inp(current=128, recent_changes=old, w=window(util=0.80, active=128, paused=3)))
    assert d.action == "Lower"


def test_a_lower_right_after_a_raise_needs_stronger_evidence() -> None:
    raised = (AppliedChange(NOW - timedelta(minutes=20), 64, 256),)
    slo = replace(SPEC, slo=SloSpec(None, 50))
    weak = replace(window(util=0.5, active=256, queued=5, tpot=80), tpot_miss_fraction=0.08)
    # surge rollouts make the restart cheap, so only the reversal rule stands in the way
    d = decide(inp(current=256, spec=slo, recent_changes=raised, w=weak, surge=True))
    assert (d.action, d.reason) == ("Hold", "RecentRaise"), d.message
    strong = replace(weak, tpot_miss_fraction=0.4)
    d = decide(inp(current=256, spec=slo, recent_changes=raised, w=strong, surge=True))
    assert d.action == "Lower" and d.target > 64, d.message


def test_a_raise_without_capacity_gain_holds() -> None:
    # iteration time proportional to the batch (no intercept to amortize): a larger batch is no faster
    flat = replace(window(util=0.30, active=64, queued=20), step_ms_intercept=0.01, step_ms_per_request=1.0)
    d = decide(inp(w=flat))
    assert (d.action, d.reason) == ("Hold", "NoCapacityGain"), d.message


def test_a_limit_that_does_not_bind_is_never_raised_ahead_of_need() -> None:
    w = replace(window(util=0.20, active=30, queued=0, tpot=10), step_ms_intercept=8.0, step_ms_per_request=0.05,
                completion_rate=5.0, mean_generation=30)
    d = decide(inp(current=64, replicas=8, spec=SLO_SPEC, w=w))
    assert (d.action, d.reason) == ("Hold", "NoPressure"), d.message


def test_a_tpot_lower_must_pay_for_its_restart() -> None:
    slo = replace(SPEC, slo=SloSpec(None, 50))
    few = replace(window(util=0.5, active=64, queued=5, tpot=60), tpot_miss_fraction=0.08)
    d = decide(inp(spec=slo, w=few, replicas=2, restart_seconds=90))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    # the same misses with a surge rollout (capacity never drops) are worth a lower
    d = decide(inp(spec=slo, w=few, replicas=2, restart_seconds=90, surge=True))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    many = replace(few, tpot_miss_fraction=0.6)
    d = decide(inp(spec=slo, w=many, replicas=2, restart_seconds=90))
    assert d.action == "Lower", d.message


def test_after_a_what_if_decline_the_simulation_reruns_only_a_period_later() -> None:
    from kvpilot.autotune.gate import RECHECK_SECONDS as WHAT_IF_RECHECK_SECONDS
    from kvpilot.autotune.whatif import Engine

    sim = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict", replicas=2,
                 restart_seconds=90.0, surge=True, ttft_ms=2000.0, tpot_ms=50.0)
    # the window carries no traffic fit, so a simulation that does run answers "no traffic fit" and the rules'
    # raise stands: the hold below can only come from the recheck period
    pressed = slo_window(misses=0.4, growth=10.0)
    base = dict(spec=SLO_SPEC, replicas=2, restart_seconds=90, w=pressed, what_if=sim)
    assert decide(inp(**base)).action == "Raise"
    between = decide(inp(**base, declined_since=NOW - timedelta(seconds=60)))
    assert (between.action, between.reason) == ("Hold", "NoPredictedGain"), between.message
    assert "reruns" in between.message
    at_period = decide(inp(**base, declined_since=NOW - timedelta(seconds=WHAT_IF_RECHECK_SECONDS)))
    assert at_period.action == "Raise", at_period.message
    severe = decide(inp(**{**base, "w": slo_window(misses=0.6, growth=10.0)},
                        declined_since=NOW - timedelta(seconds=60)))
    assert severe.action == "Raise", severe.message


def test_the_last_decline_is_read_from_status() -> None:
    from kvpilot.api.status import AutotuneStatus
    from kvpilot.desired.tuning import declined_since as _declined_since

    at = AutotuneStatus(what_if_declined_at="2026-11-29T11:58:00Z")
    assert _declined_since(at, NOW) == NOW - timedelta(seconds=120)
    assert _declined_since(AutotuneStatus(what_if_declined_at="yesterday"), NOW) is None
    assert _declined_since(AutotuneStatus(), NOW) is None
    assert _declined_since(None, NOW) is None


def test_status_records_a_decline_only_when_it_stands_and_forgets_it_on_a_change() -> None:
    from kvpilot.api.status import AutotuneStatus
    from kvpilot.desired.batching import autotune_status

    hold = Decision("Hold", 64, "NoPredictedGain", "no candidate beats staying put", recheck_later=True)
    skip = Decision("Hold", 64, "NoPredictedGain", "the simulation declined it 60s ago")  # the recheck period
    first = autotune_status(AutotuneStatus(), hold, current=64, applied=False, now=NOW)
    assert first.what_if_declined_at == "2026-11-29T12:00:00Z"
    skipped = autotune_status(first, skip, current=64, applied=False, now=NOW + timedelta(seconds=60))
    assert skipped.what_if_declined_at == "2026-11-29T12:00:00Z"
    rerun = autotune_status(first, hold, current=64, applied=False, now=NOW + timedelta(seconds=120))
    assert rerun.what_if_declined_at == "2026-11-29T12:02:00Z"
    raised = autotune_status(rerun, Decision("Raise", 128, "QueueWithHeadroom", "raise"), current=64, applied=True,
                             now=NOW)
    assert raised.what_if_declined_at is None


# -- following a phase shift without flapping ---------------------------------------------------------------------

TPOT_SPEC = replace(SPEC, slo=SloSpec(3000, 50))


def test_undoing_a_recent_raise_past_its_start_needs_most_requests_to_miss_tpot() -> None:
    raised = (AppliedChange(NOW - timedelta(minutes=10), 64, 128),)
    # p95 TPOT at twice the objective sizes the lower to 64, the value the raise left: never back to it
    broken = replace(window(util=0.4, active=128, tpot=100), tpot_miss_fraction=0.3)
    d = decide(inp(current=128, spec=TPOT_SPEC, recent_changes=raised, w=broken, surge=True))
    assert (d.action, d.reason) == ("Hold", "WouldOscillate"), d.message
    # most requests miss TPOT: the traffic changed; the lower goes past 64 by a step worth a restart
    severe = replace(broken, tpot_miss_fraction=0.8)
    d = decide(inp(current=128, spec=TPOT_SPEC, recent_changes=raised, w=severe, surge=True))
    assert d.action == "Lower" and d.target <= 64 / 1.25, d.message
    assert "undoing the change from 64" in d.message


def test_a_severe_tpot_break_lowers_back_to_a_floor_the_raise_left() -> None:
    """The floor is the value a recent raise left (64): past it is out of bounds. Most requests missing TPOT at
    128 is the measured harm: back to 64, never held at 128 for the horizon; a mild break still holds."""
    floor = replace(TPOT_SPEC, min_batch_size=64)
    raised = (AppliedChange(NOW - timedelta(minutes=10), 64, 128),)
    broken = replace(window(util=0.4, active=128, tpot=100), tpot_miss_fraction=0.8)
    d = decide(inp(current=128, spec=floor, recent_changes=raised, w=broken, surge=True))
    assert (d.action, d.target) == ("Lower", 64), d.message
    # undoing the last change on a measurement is that change's rollback, not a reversal (the budget and the
    # oscillation count leave it out; verification bars the raise)
    assert d.reason == "RolledBack", d.message
    earlier = (AppliedChange(NOW - timedelta(minutes=5), 128, 128 + 64), *raised)
    d = decide(inp(current=128, spec=floor, recent_changes=earlier, w=broken, surge=True))
    assert d.reason != "RolledBack", d.message  # 128 is not what the last change set
    mild = replace(broken, tpot_miss_fraction=0.3)
    d = decide(inp(current=128, spec=floor, recent_changes=raised, w=mild, surge=True))
    assert d.action == "Hold", d.message


def test_a_raise_past_where_a_recent_lower_started_follows_a_phase_shift() -> None:
    lowered = (AppliedChange(NOW - timedelta(minutes=14), 64, 32),)
    queue = replace(window(util=0.2, active=32, queued=20, tpot=20), ttft_miss_fraction=0.35, tpot_miss_fraction=0.0)
    d = decide(inp(current=32, spec=TPOT_SPEC, recent_changes=lowered, w=queue, surge=True))
    assert d.action == "Raise" and d.target >= 64 * 1.25, d.message  # past 64, never back to it
    few = replace(queue, ttft_miss_fraction=0.10)
    d = decide(inp(current=32, spec=TPOT_SPEC, recent_changes=lowered, w=few, surge=True))
    assert d.action != "Raise" or d.target < 64, d.message


def test_at_most_one_reversal_per_planning_horizon() -> None:
    """64 -> 32 (lower), then 32 -> 128 (undone on a phase shift); going back below 128's start again within
    the horizon would be a second reversal: held, unless most requests miss TPOT (issue 18: a protective lower
    the measurements call for is vetoed neither by the what-if nor by the reversal budget)."""
    history = (AppliedChange(NOW - timedelta(minutes=5), 32, 128), AppliedChange(NOW - timedelta(minutes=20), 64, 32))
    broken = replace(window(util=0.4, active=128, tpot=200), tpot_miss_fraction=0.3)
    d = decide(inp(current=128, spec=TPOT_SPEC, recent_changes=history, w=broken, surge=True))
    assert (d.action, d.reason) == ("Hold", "WouldOscillate"), d.message
    severe = replace(broken, tpot_miss_fraction=0.9)
    d = decide(inp(current=128, spec=TPOT_SPEC, recent_changes=history, w=severe, surge=True))
    assert d.action == "Lower" and d.reason == "TpotObjectiveBroken", d.message


def test_with_the_simulation_a_protective_lower_is_sized_from_the_batch_that_runs() -> None:
    """A limit far above the batch (512, batch 150): sized from the limit, the lower (to 256-448) would not
    bind; sized from the batch it does, and the simulation then confirms it (here only the rules run)."""
    from kvpilot.autotune.rules import decide_from_signals
    from kvpilot.autotune.whatif import Engine

    model = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict",
                   replicas=2, restart_seconds=90.0, surge=True, ttft_ms=3000.0, tpot_ms=50.0)
    w = replace(window(util=0.4, active=150, tpot=80), tpot_miss_fraction=0.7)
    rules_only = decide_from_signals(inp(current=512, spec=TPOT_SPEC, w=w, surge=True), w, 8, 1024)
    assert (rules_only.action, rules_only.reason) == ("Hold", "LimitNotBinding"), rules_only.message
    simulated = decide_from_signals(inp(current=512, spec=TPOT_SPEC, w=w, surge=True, what_if=model), w, 8, 1024)
    assert simulated.action == "Lower" and simulated.target < 150, simulated.message


def _model() -> object:
    from kvpilot.autotune.whatif import Engine

    return Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict",
                  replicas=2, restart_seconds=90.0, surge=True, ttft_ms=3000.0, tpot_ms=50.0)


def test_the_simulation_never_sees_or_picks_a_value_left_recently(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if chooses among the candidates as the guarantees leave them: 64 (left 10 minutes ago) is moved
    past, never offered; a simulation that would take the value nearest 64 gets at most 51."""
    import kvpilot.autotune.policy as policy

    seen: list[list[int]] = []

    def nearest_64(_e: object, _w: object, _cur: int, options: list[int], *_a: object, **_k: object) -> WhatIf:
        seen.append(list(options))
        return WhatIf(min(options, key=lambda c: abs(c - 64)), "stub")

    monkeypatch.setattr(policy, "what_if_verdict", nearest_64)
    raised = (AppliedChange(NOW - timedelta(minutes=10), 64, 128),)
    w = replace(window(util=0.4, active=128, tpot=70), tpot_miss_fraction=0.8)
    d = decide(inp(current=128, spec=TPOT_SPEC, recent_changes=raised, w=w, surge=True, what_if=_model()))
    assert seen and all(not 64 / 1.25 <= c <= 64 * 1.25 for c in seen[0]), seen
    assert d.action == "Lower" and d.target <= 51, d.message


def test_every_value_left_within_the_horizon_is_kept_clear_not_only_the_latest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """64 -> 128 -> 256, then most requests miss TPOT: a lower sized to 128 goes past it (102), and one sized to
    64 (from the batch that runs, with the simulation) goes past 64 too, never back to either."""
    import kvpilot.autotune.policy as policy

    def clear(target: int) -> bool:
        return all(not a / 1.25 <= target <= a * 1.25 for a in (64, 128))

    history = (AppliedChange(NOW - timedelta(minutes=5), 128, 256), AppliedChange(NOW - timedelta(minutes=10), 64, 128))
    w = replace(window(util=0.4, active=250, tpot=200), tpot_miss_fraction=0.9)
    d = decide(inp(current=256, spec=TPOT_SPEC, recent_changes=history, w=w, surge=True))
    assert d.action == "Lower" and d.target == 102 and clear(d.target), d.message
    seen: list[list[int]] = []

    def largest(_e: object, _w: object, _cur: int, options: list[int], *_a: object, **_k: object) -> WhatIf:
        seen.append(list(options))
        return WhatIf(max(options), "stub")

    monkeypatch.setattr(policy, "what_if_verdict", largest)
    w = replace(window(util=0.4, active=128, tpot=200), tpot_miss_fraction=0.9)
    d = decide(inp(current=256, spec=TPOT_SPEC, recent_changes=history, w=w, surge=True, what_if=_model()))
    assert seen and all(clear(c) for c in seen[0]), seen
    assert d.action == "Lower" and clear(d.target), d.message
    assert "past 64, not back to it" in d.message  # the rules' own target (64) was moved past 64


def test_reasons_are_typed_and_their_values_are_the_api() -> None:
    """Every reason is a TunerReason (a made-up one is refused); the values users alert on never change."""
    from kvpilot.autotune.reasons import TunerReason

    assert isinstance(decide(inp(w=window(util=0.30, active=64, queued=20))).reason, TunerReason)
    with pytest.raises(ValueError):
        Decision("Hold", 64, "WithinTarget", "not a reason the tuner gives")
    assert f"{TunerReason.NO_PREDICTED_GAIN}" == "NoPredictedGain"
    assert {r.value for r in TunerReason} == {
        "RolloutInProgress", "OutOfBounds", "InsufficientData", "PartialSignals", "RequestsPaused",
        "KvCachePressure", "TpotObjectiveBroken", "LimitNotBinding", "NotWorthARestart", "TpotBreakUnconfirmed",
        "KvPressureUnconfirmed", "NoPressure",
        "ReservationBound", "AtTarget", "TpotNearObjective", "QueueWithHeadroom", "CeilingTooLow",
        "RebuildNotWorthIt", "ChangeTooSmall", "WouldOscillate", "RecentRaise", "NoCapacityGain", "Cooldown",
        "NoPredictedGain", "WhatIfBudgetSpent", "TrafficShifting", "RolledBack", "BarredByVerification",
        "AwaitingVerification"}


def test_the_gate_holds_unconfirmed_changes_only_when_its_budget_is_spent() -> None:
    model = _model()
    spent = WhatIfGate(budget_left=False, model=model)  # type: ignore[arg-type]
    assert spent.engine is None, "without budget the rules decide alone"
    for change in (Decision("Raise", 128, "QueueWithHeadroom", "queue"),
                   Decision("Rebuild", 64, "CeilingTooLow", "ceiling", ceiling_request=1024)):
        held = spent.withheld(change, 64, called_for=False)
        assert (held.action, held.reason, held.target) == ("Hold", "WhatIfBudgetSpent", 64)
        assert held.message.startswith(change.message + "; but this engine spent its what-if CPU budget")
    passes = (Decision("Lower", 32, "RequestsPaused", "protective"), Decision("Lower", 512, "OutOfBounds", "clamp"),
              Decision("Hold", 64, "AtTarget", "hold"))
    assert all(spent.withheld(d, 64, called_for=d.reason == "RequestsPaused") == d for d in passes)
    # A mild TPOT break beside as many TTFT misses (signals.tpot_trade_off): protective by name, judged like a raise.
    trade = Decision("Lower", 48, "TpotObjectiveBroken", "tpot")
    assert spent.withheld(trade, 64, called_for=False).reason == "WhatIfBudgetSpent"
    assert spent.withheld(trade, 64, called_for=True) == trade
    raise_ = Decision("Raise", 128, "QueueWithHeadroom", "queue")
    assert WhatIfGate(budget_left=False).withheld(raise_, 64, False) == raise_, "no model: nothing could confirm it"
    assert WhatIfGate(budget_left=False, model_valid=False, model=model).withheld(raise_, 64, False) == raise_  # type: ignore[arg-type]
    assert WhatIfGate(model=model).engine is model  # type: ignore[arg-type]
    assert WhatIfGate(model=model, model_valid=False).engine is None  # type: ignore[arg-type]
