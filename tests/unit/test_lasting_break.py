"""A TPOT break with many misses is weighed on the settled pool at its limit until it lasts (rules._lasting_misses,
verification.Baseline.missing_streak).

A swell lasts a window or two: on the suite's overloaded case (22 ms TPOT, 2048, no spare GPU) one window missed
62% where static 2048 serves 95% of the requests in time, and the lower it called for cost 8% of the run. A cliff
lasts: LASTING_BREAK_WINDOWS windows in a row missing 20% or more are taken at their own share again.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from kvpilot.api.models import SloSpec
from kvpilot.api.status import AutotuneStatus
from kvpilot.autotune.constants import LASTING_BREAK_WINDOWS
from kvpilot.autotune.costs import lower_pays
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.inputs import ChangeCost, TunerHistory, TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.signals import tpot_bound
from kvpilot.autotune.verification import Baseline, Memory
from kvpilot.desired.verifying import memory_of, verification_status
from kvpilot.autotune.whatif import Decline, WhatIf
from tests.unit.test_autotune_rollback import MODEL, NOW, SPEC, figures, inp, kv

SEVERE = kv(active=512, tpot=80.0, tpot_misses=0.62)


def pool(shares: list[float], limit: int = 512) -> Memory:
    """Verification's baseline at ``limit`` after clean 15 s windows ending now with these shares in time."""
    base = Baseline()
    start = NOW.timestamp() - 15.0 * len(shares)
    for k, share in enumerate(shares):
        base = base.observe(figures(start + 15.0 * (k + 1), limit, share), limit)
    return Memory(baseline=base)


def test_the_streak_counts_windows_in_a_row_that_missed_many_and_a_good_one_ends_it() -> None:
    assert pool([0.99] * 10).baseline.missing_streak == 0
    assert pool([0.99] * 10 + [0.4]).baseline.missing_streak == 1
    assert pool([0.99] * 10 + [0.4] * 10).baseline.missing_streak == LASTING_BREAK_WINDOWS  # bounded
    assert pool([0.99] * 10 + [0.4] * 5 + [0.95]).baseline.missing_streak == 0
    assert pool([0.4] * 8, limit=512).baseline.observe(figures(NOW.timestamp() + 15, 256, 0.4), 256) \
        .missing_streak == 0  # a new limit starts afresh (its first window is still settling)


def test_a_swell_is_weighed_on_the_pool_and_a_break_that_lasts_at_its_own_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvpilot.autotune.policy as policy

    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: WhatIf(None, "no gain", Decline.NO_GAIN))
    swell = TunerHistory(last_applied_at=NOW - timedelta(hours=1), verification=pool([0.99] * 11 + [0.38]))
    d = decide(no_surge(SEVERE, history=swell))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "62% of this window's requests missed, 7.8% over the last" in d.message
    lasting = replace(swell, verification=pool([0.99] * 9 + [0.38] * LASTING_BREAK_WINDOWS))
    d = decide(no_surge(SEVERE, history=lasting))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    assert "over the last" not in d.message and "62% of requests miss" in d.message


def test_the_streak_round_trips_through_status_and_a_forged_one_is_bounded() -> None:
    mem = pool([0.99] * 9 + [0.38] * 2)
    record = verification_status(mem, None)
    assert record.baseline_missing_windows == 2
    assert memory_of(AutotuneStatus(verification=record), NOW).baseline.missing_streak == 2
    for forged, read in ((-3, 0), (10**6, LASTING_BREAK_WINDOWS)):
        hostile = replace(record, baseline_missing_windows=forged)
        assert memory_of(AutotuneStatus(verification=hostile), NOW).baseline.missing_streak == read
    assert verification_status(pool([0.99] * 5), None).baseline_missing_windows is None  # nothing to say


def no_surge(w: object, **kw: object) -> TunerInput:
    cost = kw.pop("cost", ChangeCost(replicas=2, restart_seconds=90.0, surge=False))
    return TunerInput(current=512, ceiling=1024, spec=SPEC, window=w, scheduler_policy="GuaranteedNoEvict",  # type: ignore[arg-type]
                      now=NOW, expected_pods=2, cost=cost, what_if=WhatIfGate(model=MODEL),  # type: ignore[arg-type]
                      history=kw.pop("history", TunerHistory(last_applied_at=NOW - timedelta(hours=1))))  # type: ignore[arg-type]


def test_most_requests_missing_pay_for_any_restart() -> None:
    slow = ChangeCost(replicas=4, restart_seconds=300.0, surge=False)
    w = kv(active=500, tpot=65.0, tpot_misses=0.9)
    worth, why = lower_pays(slow, 512, w, 0.9, SloSpec(3000, 60))
    assert worth and "90% of requests miss" in why


def test_a_step_fit_below_zero_bounds_nothing() -> None:
    w = replace(kv(active=64), step_ms_intercept=-50.0, step_ms_per_request=0.5, mean_generation=10.0)
    assert tpot_bound(SloSpec(3000, 60), w) is None


def test_the_pool_at_another_limit_is_no_evidence() -> None:
    other = Memory(baseline=pool([0.99] * 12, limit=256).baseline)
    d = decide(inp(w=SEVERE, mem=other))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
