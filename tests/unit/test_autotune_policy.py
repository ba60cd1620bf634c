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
from kvpilot.autotune.inputs import ChangeCost, TunerHistory, TunerInput
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
