"""Table tests and properties of the autotune policy."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.api.models import AutotuneSpec, MetricsSpec, SloSpec
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.inputs import AppliedChange, ChangeCost, TunerHistory, TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.window import KvWindow

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SPEC = AutotuneSpec(enabled=True, mode="Auto", min_batch_size=8, max_batch_size=1024,
                    target_kv_cache_utilization_percent=85, interval_seconds=30, cooldown_seconds=600,
                    warmup_seconds=60, allow_rebuild=False, metrics=MetricsSpec("Pod"))


def window(util: float = 0.5, active: int = 64, queued: float = 0.0, paused: int = 0, tpot: float | None = None,
           max_blocks: int = 30000) -> KvWindow:
    used = int(util * max_blocks)
    return KvWindow(samples=10, pods=1, peak_utilization=util, mean_utilization=util, peak_used_blocks=used,
                    max_blocks=max_blocks, tokens_per_block=32, peak_active=active, mean_active=active,
                    peak_queued=int(queued), mean_queued=queued, paused=paused, runtime_batch_size=64,
                    tpot_p95_ms=tpot)


COST_FIELDS = ("replicas", "restart_seconds", "build_seconds", "surge")
HISTORY_FIELDS = ("last_applied_at", "recent_changes", "declined_since")


def inp(current: int = 64, ceiling: int = 512, w: KvWindow | None = None, **kw: object) -> TunerInput:
    """A TunerInput from flat keywords: those of ChangeCost and TunerHistory go to their part, and a what-if
    model (``what_if``) goes into an open gate."""
    if kw.get("what_if") is not None and not isinstance(kw["what_if"], WhatIfGate):
        kw["what_if"] = WhatIfGate(model=kw["what_if"])  # type: ignore[arg-type]
    cost = {k: kw.pop(k) for k in COST_FIELDS if k in kw}
    history = {k: kw.pop(k) for k in HISTORY_FIELDS if k in kw}
    defaults = dict(current=current, ceiling=ceiling, spec=SPEC, window=w if w is not None else window(),
                    scheduler_policy="GuaranteedNoEvict", rollout_in_progress=False, build_in_progress=False,
                    now=NOW, cost=ChangeCost(**{"replicas": 4, "restart_seconds": 60.0, **cost}),  # type: ignore[arg-type]
                    history=TunerHistory(**history))  # type: ignore[arg-type]
    defaults.update(kw)
    return TunerInput(**defaults)  # type: ignore[arg-type]


CASES = {
    "full batch, queue, headroom -> raise": (inp(w=window(util=0.30, active=64, queued=20)), "Raise",
                                               "QueueWithHeadroom"),
    "queue but batch not full -> reservation bound, hold": (inp(w=window(util=0.30, active=40, queued=20)), "Hold",
                                                            "ReservationBound"),
    "no queue -> hold": (inp(w=window(util=0.30, active=64, queued=0)), "Hold", "NoPressure"),
    "pool above target, evicting policy -> lower": (
        inp(scheduler_policy="MaxUtilization", w=window(util=0.99, active=64, queued=5)), "Lower", "KvCachePressure"),
    "pool above target, no-evict policy -> hold": (inp(w=window(util=0.99, active=64, queued=5)), "Hold", "AtTarget"),
    "paused requests -> lower": (inp(w=window(util=0.80, active=64, paused=3)), "Lower", "RequestsPaused"),
    "tpot objective broken -> lower": (
        inp(spec=replace(SPEC, slo=SloSpec(None, 50)), w=window(util=0.5, active=64, queued=5, tpot=80)), "Lower",
        "TpotObjectiveBroken"),
    "at target -> hold": (inp(w=window(util=0.84, active=64, queued=10)), "Hold", "AtTarget"),
    "rollout -> hold": (inp(rollout_in_progress=True, w=window(util=0.3, active=64, queued=20)), "Hold",
                        "RolloutInProgress"),
    "build -> hold": (inp(build_in_progress=True, w=window(util=0.3, active=64, queued=20)), "Hold",
                      "RolloutInProgress"),
    "cooldown -> hold": (inp(last_applied_at=NOW - timedelta(seconds=60), w=window(util=0.3, active=64, queued=20)),
                         "Hold", "Cooldown"),
    "no data -> hold": (inp(w=replace(window(), samples=0)), "Hold", "InsufficientData"),
    "above bounds -> lower at once": (inp(current=2048, ceiling=512), "Lower", "OutOfBounds"),
    "at ceiling, no rebuild -> hold": (inp(current=512, ceiling=512, w=window(util=0.2, active=512, queued=600)),
                                       "Hold", "QueueWithHeadroom"),
    "at ceiling, rebuild allowed -> rebuild": (
        inp(current=512, ceiling=512, spec=replace(SPEC, allow_rebuild=True), w=window(util=0.2, active=512,
                                                                                         queued=600)),
        "Rebuild", "CeilingTooLow"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decisions(case: tuple[TunerInput, str, str]) -> None:
    tuner_input, action, reason = case
    d = decide(tuner_input)
    assert (d.action, d.reason) == (action, reason), d.message


def test_raise_is_bounded_by_doubling_and_the_pool() -> None:
    d = decide(inp(current=64, w=window(util=0.10, active=64, queued=50)))
    assert d.target == 128  # at most x2 per step even when the pool fits far more
    d = decide(inp(current=64, w=window(util=0.50, active=64, queued=50)))
    assert 64 < d.target <= int(0.85 * 30000 / (0.50 * 30000 / 64))


def test_small_changes_are_not_worth_a_restart() -> None:
    w = replace(window(util=0.78, active=64, queued=0, tpot=20), ttft_miss_fraction=0.5, completion_rate=10)
    d = decide(inp(current=64, spec=replace(SPEC, slo=SloSpec(2000, 50)), w=w))
    assert d.action == "Hold" and d.reason == "ChangeTooSmall", d.message


def test_rebuild_request_is_a_power_of_two_within_the_autotune_bound() -> None:
    d = decide(inp(current=512, ceiling=512, spec=replace(SPEC, allow_rebuild=True),
                   w=window(util=0.1, active=512, queued=600)))
    assert d.ceiling_request == 1024


windows = st.builds(
    window, util=st.floats(0, 1), active=st.integers(0, 4096), queued=st.floats(0, 500), paused=st.integers(0, 50),
    tpot=st.one_of(st.none(), st.floats(1, 500)), max_blocks=st.integers(1, 100000),
)


@settings(max_examples=400, deadline=None)
@given(current=st.integers(1, 4096), ceiling=st.integers(1, 4096), w=windows, lo=st.integers(1, 512),
       hi=st.integers(1, 4096), rolling=st.booleans(), building=st.booleans(), rebuild=st.booleans(),
       tpot_slo=st.one_of(st.none(), st.integers(1, 200)))
def test_no_decision_exceeds_the_ceiling_or_the_bounds(current: int, ceiling: int, w: KvWindow, lo: int, hi: int,
                                                      rolling: bool, building: bool, rebuild: bool,
                                                      tpot_slo: int | None) -> None:
    spec = replace(SPEC, min_batch_size=min(lo, hi), max_batch_size=max(lo, hi), allow_rebuild=rebuild,
                   slo=SloSpec(None, tpot_slo) if tpot_slo else None)
    d: Decision = decide(inp(current=current, ceiling=ceiling, w=w, spec=spec, rollout_in_progress=rolling,
                             build_in_progress=building))
    upper = min(spec.max_batch_size, ceiling)
    lower = min(spec.min_batch_size, upper)
    if d.action in ("Raise", "Lower"):
        assert lower <= d.target <= upper
    if d.action == "Rebuild":
        assert d.ceiling_request is not None and ceiling < d.ceiling_request <= spec.max_batch_size
    if rolling or building:
        assert not d.changes  # never during a rollout or build


SLO_SPEC = replace(SPEC, slo=SloSpec(2000, 50))


def slo_window(misses: float, queued: float = 30, active: int = 64, completion: float = 10.0,
               growth: float = 2.0) -> KvWindow:
    return replace(window(util=0.3, active=active, queued=queued, tpot=20), ttft_miss_fraction=misses,
                   ttft_p95_ms=2500 if misses else 500, completion_rate=completion, queue_growth=growth)


def test_a_queue_that_meets_the_ttft_objective_is_left_alone() -> None:
    d = decide(inp(spec=SLO_SPEC, w=slo_window(misses=0.0, growth=0.0)))
    assert (d.action, d.reason) == ("Hold", "NoPressure")


def test_ttft_misses_raise_by_littles_law_in_one_step() -> None:
    # 10 req/s complete, the queue grows by 10 req/s: arrivals 20 -> 64 * 2 * 1.25 = 160 (above what the
    # 60% misses alone ask for: 64 * 1.6 * 1.25 = 128)
    d = decide(inp(spec=SLO_SPEC, replicas=2, restart_seconds=90, w=slo_window(misses=0.6, growth=10.0)))
    assert d.action == "Raise" and d.target == 160, d.message


def test_a_restart_that_costs_more_than_it_saves_is_not_made() -> None:
    d = decide(inp(spec=SLO_SPEC, replicas=2, restart_seconds=600, w=slo_window(misses=0.2)))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart")


def test_a_full_batch_waiting_for_kv_blocks_is_reservation_bound() -> None:
    w = replace(window(util=0.5, active=64, queued=30), mean_unscheduled=20.0)
    d = decide(inp(w=w))
    assert (d.action, d.reason) == ("Hold", "ReservationBound"), d.message


def test_a_rebuild_that_takes_longer_than_it_pays_is_not_requested() -> None:
    spec = replace(SPEC, allow_rebuild=True)
    w = window(util=0.1, active=512, queued=300)
    quick = decide(inp(current=512, ceiling=512, spec=spec, w=w, build_seconds=300))
    slow = decide(inp(current=512, ceiling=512, spec=spec, w=w, build_seconds=1800))
    assert quick.action == "Rebuild"
    assert (slow.action, slow.reason) == ("Hold", "RebuildNotWorthIt")


def test_a_broken_tpot_with_a_limit_that_does_not_bind_is_not_lowered() -> None:
    spec = replace(SPEC, slo=SloSpec(2000, 50))
    binding = decide(inp(spec=spec, w=window(util=0.3, active=64, queued=0, tpot=80)))
    idle = decide(inp(spec=spec, w=window(util=0.3, active=17, queued=0, tpot=80)))
    assert (binding.action, binding.reason) == ("Lower", "TpotObjectiveBroken")
    assert (idle.action, idle.reason) == ("Hold", "LimitNotBinding")


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


def test_status_records_a_decline_only_when_the_simulation_ran_and_forgets_it_on_a_change() -> None:
    from kvpilot.api.status import AutotuneStatus
    from kvpilot.desired.batching import autotune_status

    hold = Decision("Hold", 64, "NoPredictedGain", "no candidate beats staying put", simulated=True)
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

    def nearest_64(_e: object, _w: object, _cur: int, options: list[int], *_a: object, **_k: object) -> tuple[int, str]:
        seen.append(list(options))
        return min(options, key=lambda c: abs(c - 64)), "stub"

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

    def largest(_e: object, _w: object, _cur: int, options: list[int], *_a: object, **_k: object) -> tuple[int, str]:
        seen.append(list(options))
        return max(options), "stub"

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
        "KvCachePressure", "TpotObjectiveBroken", "LimitNotBinding", "NotWorthARestart", "TpotBreakUnconfirmed", "NoPressure",
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
