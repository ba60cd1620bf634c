"""A mild TPOT break is judged on the misses pooled at the limit in force, not on one window (rules._lasting_misses).

Under steady traffic a pod's batch swells and drains by chance, and a 15 s window in a swell misses several times
what the traffic misses on average. Measured on the suite (rag-then-chat-a100 with prefill 30% slower, from 2048):
windows missing 5-11% called for lowers that fixed nothing, where the document phase missed 1.4% in all. A window
with many misses (20% or more) still acts at once, and where no settled evidence can come the window decides.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from kvpilot.autotune.constants import (MIN_WINDOW_REQUESTS, REVERSAL_MIN_TPOT_MISSES, TPOT_CONFIRM_SECONDS,
                                       TPOT_WINDOW_REQUESTS)
from kvpilot.autotune.policy import decide
from kvpilot.autotune.verification import Baseline, Memory
from kvpilot.autotune.verify import MAX_SETTLE_SECONDS, MIN_REQUESTS, Settle
from tests.unit.test_autotune_rollback import NOW, figures, inp, kv

# p95 TPOT 65 ms against 60 ms, 11% of the window's requests over it: alone, a lower pays (0.5 x 11% of the
# 1800 s horizon against twice the 18 s a surge restart costs).
MILD = kv(active=512, tpot=65.0, tpot_misses=0.11)


def settled(share: float, limit: int = 512, windows: int = 12) -> Memory:
    """Verification's baseline at ``limit``: ``windows`` clean 15 s windows ending now, ``share`` served in time."""
    base = Baseline()
    start = NOW.timestamp() - 15.0 * windows
    for k in range(windows):
        base = base.observe(figures(start + 15.0 * (k + 1), limit, share), limit)
    return Memory(baseline=base)


def test_a_mild_break_where_the_limit_serves_well_over_minutes_is_not_worth_a_restart() -> None:
    mem = settled(0.986)
    assert mem.baseline.side.seconds >= TPOT_CONFIRM_SECONDS
    d = decide(inp(w=MILD, mem=mem))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "11% of this window's requests missed" in d.message and "1.4% over the last" in d.message


def test_a_mild_break_that_lasts_is_lowered() -> None:
    d = decide(inp(w=MILD, mem=settled(0.85)))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    assert d.target < 512 and "15.0% over the last" in d.message


def test_many_misses_in_one_window_are_weighed_on_the_pool_too() -> None:
    """A swell is a swell however deep: one window missing 62% where the minutes around it served in time called
    for a lower that cost 8% of the run (tight-tpot-overload from 2048 without a spare GPU)."""
    severe = kv(active=512, tpot=80.0, tpot_misses=0.62)
    d = decide(inp(w=severe, mem=settled(0.99)))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "62% of this window's requests missed, 1.0% over the last" in d.message
    # a break that lasts shows in the pool, and is lowered
    d = decide(inp(w=severe, mem=settled(0.6)))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message


def test_many_misses_in_one_window_act_at_once_without_settled_evidence() -> None:
    severe = kv(active=512, tpot=80.0, tpot_misses=REVERSAL_MIN_TPOT_MISSES)
    young = settled(0.99, windows=3)  # 45 s at 512: less than a minute of settled traffic
    assert young.baseline.side.seconds < TPOT_CONFIRM_SECONDS
    d = decide(inp(w=severe, mem=young))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    assert "over the last" not in d.message
    d = decide(inp(w=severe, mem=settled(0.99, limit=256)))  # the pool is another limit's
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message


def test_a_mild_break_while_the_batch_settles_waits() -> None:
    # One clean window at 512 so far (the limit just went in force): no evidence yet.
    base = Baseline().observe(figures(NOW.timestamp(), 512, 0.9), 512)
    assert base.settle.in_force_s is not None and base.side.seconds == 0
    d = decide(inp(w=MILD, mem=Memory(baseline=base)))
    assert (d.action, d.reason) == ("Hold", "TpotBreakUnconfirmed"), d.message
    assert "0s of settled traffic" in d.message


def test_where_no_settled_evidence_comes_the_window_decides() -> None:
    # The limit went in force long ago, but no comparable window has counted since (the load keeps moving).
    since = NOW.timestamp() - MAX_SETTLE_SECONDS - TPOT_CONFIRM_SECONDS - 15.0
    stale = Memory(baseline=Baseline(512, settle=Settle(since, 400.0, since + 30.0)))
    d = decide(inp(w=MILD, mem=stale))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    # No memory at all (tuning just switched on, status lost): the window decides too.
    assert decide(inp(w=MILD)).action == "Lower"


def test_a_baseline_at_another_limit_says_nothing_of_this_one() -> None:
    d = decide(inp(w=MILD, mem=settled(0.99, limit=256), last_applied_at=NOW - timedelta(seconds=900)))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message


def test_a_window_of_a_handful_of_requests_is_no_evidence_of_a_break() -> None:
    """At 0.3 req/s a 15 s window finishes about six requests, and three missing is no cliff: on the suite's
    KV-scarce L4 decoding 30% off its profile such a window lowered 64 -> 8 where every limit serves alike."""
    few = replace(kv(active=512, tpot=104.0, tpot_misses=0.5), completion_rate=(MIN_WINDOW_REQUESTS - 4) / 30.0)
    d = decide(inp(w=few))
    assert (d.action, d.reason) == ("Hold", "TpotBreakUnconfirmed"), d.message
    assert "6 requests finished in it, too few to tell" in d.message
    # With settled minutes at this limit they decide, even after three windows in a row that missed a fifth.
    streak = settled(0.97)
    base = streak.baseline
    streak = Memory(baseline=replace(base, missing_streak=3))
    d = decide(inp(w=few, mem=streak))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "3.0% over the last" in d.message
    # A burst of ten to 39 is no evidence of the traffic either: a TPOT break's share weighs alone on the
    # requests verification holds a share to (on the suite's L4 a window where 7 of 10 missed lowered 64 -> 8).
    burst = replace(few, completion_rate=(TPOT_WINDOW_REQUESTS - 1) / 30.0)
    d = decide(inp(w=burst))
    assert (d.action, d.reason) == ("Hold", "TpotBreakUnconfirmed"), d.message
    assert "39 requests finished in it" in d.message
    d = decide(inp(w=burst, mem=streak))  # nor does it count as a break that lasts
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert decide(inp(w=replace(burst, completion_rate=TPOT_WINDOW_REQUESTS / 30.0), mem=streak)).action == "Lower"
    # The same share in a window of TPOT_WINDOW_REQUESTS or more is taken at once.
    enough = replace(few, completion_rate=TPOT_WINDOW_REQUESTS / 30.0)
    assert decide(inp(w=enough)).action == "Lower"


def test_a_tpot_break_s_window_share_needs_what_verification_asks_of_a_share() -> None:
    """One bar for 'a share means anything': a window's TPOT share weighs alone on as many requests as a side of a
    verification needs (constants.TPOT_WINDOW_REQUESTS is written out, not imported, to keep constants a leaf)."""
    assert TPOT_WINDOW_REQUESTS == MIN_REQUESTS
