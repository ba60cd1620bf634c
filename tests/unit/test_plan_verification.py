"""Verification through plan() (issue 18): status keeps what it needs window after window, a change that serves
worse is rolled back with both windows' figures in status and in a Warning Event, the direction is barred, and a
malformed status.autotune.verification can never cause a rollback."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from kvpilot.api.status import parse_status, status_dict
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.verifying import memory_of, verification_status
from kvpilot.autotune.whatif import WhatIf
from tests.unit.helpers import engine
from tests.unit.test_plan import built

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
TUNED = dict(autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 1024, "intervalSeconds": 15,
                       "slo": {"timeToFirstTokenMillis": 3000, "timePerOutputTokenMillis": 60}})


def kv(limit: int, share: float, rate: float = 30.0) -> KvWindow:
    """One pod's 15 s window at ``limit`` where ``share`` of the resolved requests met both objectives."""
    return KvWindow(samples=20, pods=1, peak_utilization=0.3, mean_utilization=0.2, peak_used_blocks=100,
                    max_blocks=1000, tokens_per_block=32, peak_active=min(limit, 400), mean_active=min(limit, 400),
                    peak_queued=0, mean_queued=0.0, paused=0, runtime_batch_size=limit, window_seconds=15.0,
                    completion_rate=rate, arrival_rate=rate, prompt_mean=150.0, output_mean=600.0,
                    resolved_rate=rate, good_rate=rate * share, ttft_miss_fraction=0.0, tpot_miss_fraction=0.0,
                    ttft_p95_ms=500.0, tpot_p95_ms=10.0)


def run(monkeypatch: pytest.MonkeyPatch, after_share: float, status: Any = None) -> list[Plan]:
    """Two minutes at 64 (share 0.56), a raise to 512 the rules propose once, then windows at 512 with
    ``after_share``; every plan's status is the next one's."""
    from kvpilot.autotune import policy

    proposed = {"done": False}

    def rules(inp: Any, w: Any, lo: int, hi: int) -> Decision:
        if inp.current == 64 and not proposed["done"] and inp.now >= T0 + timedelta(seconds=120):
            proposed["done"] = True
            return Decision("Raise", 512, "QueueWithHeadroom", "requests queue")
        return Decision("Hold", inp.current, "NoPressure", "fine")

    monkeypatch.setattr(policy, "decide_from_signals", rules)
    monkeypatch.setattr(policy, "what_if_verdict", lambda _e, _w, cur, options, *a, **k: WhatIf(max(options), "confirmed"))
    e = engine(**TUNED)
    first = plan(e, Observed(claim_phase="Bound"), Settings(), T0)
    observed = built(first)
    if status is not None:
        observed = replace(observed, status=parse_status(status))
    plans = []
    for k in range(1, 40):
        now = T0 + timedelta(seconds=15 * k)
        limit = (observed.status.batching.max_batch_size if observed.status.batching else None) or 64
        p = plan(e, replace(observed, kv=kv(limit, 0.56 if limit == 64 else after_share)), Settings(), now)
        plans.append(p)
        observed = replace(observed, status=p.status)
    return plans


def test_a_raise_that_serves_worse_is_rolled_back_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = run(monkeypatch, after_share=0.10)
    limits = [p.status.batching.max_batch_size for p in plans if p.status.batching]
    assert 512 in limits and limits[-1] == 64
    back = next(p for p in plans if p.decision is not None and p.decision.reason == "RolledBack")
    doc = status_dict(back.status)
    assert doc["batching"]["reason"] == "AutotuneRolledBack"
    history = doc["autotune"]["history"]
    assert history[0]["reason"] == "RolledBack" and history[0]["applied"] and history[0]["toBatchSize"] == 64
    v = doc["autotune"]["verification"]
    assert v["outcome"] == "RollBack" and v["reason"] == "ServesWorse"
    assert "before, at 64" in v["message"] and "after, at 512" in v["message"]
    assert v["bars"] == [{"direction": "Raise", "batchSize": 182, "until": v["bars"][0]["until"],
                          "requestsPerMinute": 1800, "promptTokens": 150}]  # the load it was measured at
    warning = [ev for ev in back.events if ev.reason == "AutotuneRolledBack"]
    assert warning and warning[0].type == "Warning" and "before, at 64" in warning[0].message
    assert all(p.decision is None or p.decision.reason != "RolledBack" for p in plans[plans.index(back) + 1:])


def test_a_raise_that_serves_as_well_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = run(monkeypatch, after_share=0.58)
    assert plans[-1].status.batching is not None and plans[-1].status.batching.max_batch_size == 512
    v = status_dict(plans[-1].status)["autotune"]["verification"]
    assert v["outcome"] == "Keep" and "watch" not in v
    assert all(p.decision is None or p.decision.reason != "RolledBack" for p in plans)


def test_status_keeps_running_sums_not_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the run's length, status.autotune.verification stays a few hundred bytes."""
    import json

    plans = run(monkeypatch, after_share=0.58)
    sizes = [len(json.dumps(status_dict(p.status)["autotune"].get("verification", {}))) for p in plans]
    assert max(sizes) < 1500, max(sizes)


@pytest.mark.parametrize("hostile", [
    {"watch": {"changedAt": "yesterday", "fromBatchSize": 64, "toBatchSize": 512}},
    {"watch": {"changedAt": "2026-11-29T11:00:00Z", "fromBatchSize": -3, "toBatchSize": 512,
               "before": {"windowsMilli": 8000, "resolved": 900, "good": 900, "sharePermille": 1000}}},
    {"baselineBatchSize": 64, "baseline": {"windowsMilli": -1, "resolved": -5}, "bars": [{"direction": "Up"}]},
    {"watch": {"changedAt": "2026-11-29T11:59:00Z", "fromBatchSize": 64, "toBatchSize": 512,
               "before": {"windowsMilli": 0, "resolved": 3600, "good": 3600, "sharePermille": 1000}}},
    {"seenUntil": "2999-01-01T00:00:00Z", "pods": 7, "bars": "all"},
])
def test_a_malformed_verification_status_never_causes_a_rollback(monkeypatch: pytest.MonkeyPatch, hostile: Any) -> None:
    """Hand-edited records that do not hold (bad times, negative or empty figures, unknown directions, wrong
    types) read as absent: verification starts afresh, never rolls back on them, and nothing raises."""
    e = engine(**TUNED)
    first = plan(e, Observed(claim_phase="Bound"), Settings(), T0)
    status = dict(status_dict(built(first).status), batching={"maxBatchSize": 512, "source": "Autotune",
                                                            "reason": "AutotuneRaised", "specValue": 64},
                  autotune={"verification": hostile})
    plans = run(monkeypatch, after_share=0.58, status=status)
    assert all(p.decision is None or p.decision.reason != "RolledBack" for p in plans)
    assert status_dict(plans[-1].status)["autotune"]["verification"]["seenUntil"] <= "2026-11-29T13"  # taken in


def test_a_bar_from_status_lasts_at_most_a_planning_horizon() -> None:
    from kvpilot.api.status import AutotuneStatus, VerificationBar, VerificationStatus

    forever = VerificationStatus(bars=(VerificationBar("Raise", 65, "2999-01-01T00:00:00Z"),))
    (bar,) = memory_of(AutotuneStatus(verification=forever), T0).bars
    assert bar.until_s <= T0.timestamp() + 1800


def test_the_memory_round_trips_through_status() -> None:
    from kvpilot.autotune.verification import Baseline, Memory, watch
    from kvpilot.autotune.bars import Bar
    from kvpilot.autotune.verify import WindowFigures

    base = Baseline()
    for k in range(8):
        base = base.observe(WindowFigures(1000.0 + 15 * k, 15.0, 64, 2, 2, 450, 450, 250, 450, 64, 10, 150, 600,
                                          split=450, tpot_missed=40, ttft_missed=95), 64)
    w = watch(base, 64, 512, 1120.0)
    for k in range(12):
        w = w.observe(WindowFigures(1210.0 + 15 * k, 15.0, 512, 2, 2, 450, 450, 45 + k, 450, 400, 10, 150, 600))
    mem = Memory(baseline=base, watch=w, bars=(Bar(True, 182, 3000.0),), seen_until_s=1400.0, pods="ab",
                 change_load=(30.0, 150.0))
    now = datetime.fromtimestamp(1400.0, timezone.utc)
    from kvpilot.api.status import AutotuneStatus

    back = memory_of(AutotuneStatus(verification=verification_status(mem, None)), now)
    assert back.verdict(1400.0).outcome == mem.verdict(1400.0).outcome == "RollBack"
    assert back.bars == mem.bars and back.seen_until_s == mem.seen_until_s and back.pods == "ab"
    assert back.change_load == (30.0, 150.0)
    assert abs(back.watch.after.share - mem.watch.after.share) < 1e-3  # type: ignore[union-attr]
    # The split of the misses by objective (which side a lasting break is on) survives the trip too.
    shares, kept = mem.baseline.side.split_shares(40), back.baseline.side.split_shares(40)
    assert shares is not None and kept is not None and abs(shares[0] - 40 / 450) < 1e-9
    assert all(abs(a - b) < 1e-2 for a, b in zip(shares, kept)), (shares, kept)


def test_the_split_by_objective_is_counted_only_where_the_pods_report_both_misses() -> None:
    from dataclasses import replace as with_

    from kvpilot.autotune.verification import figures_from_window
    from tests.unit.test_autotune_rollback import kv

    w = with_(kv(active=64, tpot=23.0, tpot_misses=0.1), ttft_miss_fraction=0.25)
    f = figures_from_window(w, 1000.0, 64, 2)
    assert f.split == f.answered > 0 and abs(f.tpot_missed - 0.1 * f.answered) < 1e-9
    assert abs(f.ttft_missed - 0.25 * f.answered) < 1e-9
    for unknown in (with_(w, ttft_miss_fraction=None), with_(w, tpot_miss_fraction=float("nan"))):
        g = figures_from_window(unknown, 1000.0, 64, 2)
        assert g.split == g.tpot_missed == g.ttft_missed == 0.0
    hostile = figures_from_window(with_(w, tpot_miss_fraction=7.0), 1000.0, 64, 2)
    assert hostile.tpot_missed == hostile.split  # a share over 1 counts as every request, no more
