"""Verification of an applied change (autotune/verify.py, issue 18): a measured loss rolls back, noise never does."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.api.status import AutotuneStatus
from kvpilot.autotune.canary import Canary, Phase
from kvpilot.autotune.verification import Baseline, CanaryWatch, Memory, verify, verify_canary, watch
from kvpilot.autotune.bars import Bar, bar_after_rollback
from kvpilot.autotune.verify import GIVE_UP_SECONDS, KEEP_SECONDS, Outcome, WindowFigures, Why

INTERVAL = 15.0
CHANGE_AT = 300.0  # the change was applied here; its rollout was done 90 s later


def window(end_s: float, limit: int | None, share: float, rate: float = 30.0, pods: int = 2, expected: int = 2,
           batch: float = 64.0, restarted: bool = False, prompt: float = 150.0, output: float = 600.0) -> WindowFigures:
    offered = rate * INTERVAL
    return WindowFigures(end_s, INTERVAL, limit, pods, expected, offered, offered, share * offered, offered, batch,
                         10.0, prompt, output, restarted)


def steady(start_s: float, end_s: float, limit: int, share: float, **kw: object) -> list[WindowFigures]:
    out, t = [], start_s + INTERVAL
    while t <= end_s:
        out.append(window(t, limit, share, **kw))  # type: ignore[arg-type]
        t += INTERVAL
    return out


BEFORE = steady(0.0, CHANGE_AT, 64, 0.56)  # issue 18's engine at 64: 16.8 of 30 req/s served in time
ROLLING = [window(CHANGE_AT + k * INTERVAL, None, 0.56) for k in range(1, 7)]  # the rollout: mixed limits


def after(limit: int, share: float, seconds: float, **kw: object) -> list[WindowFigures]:
    return ROLLING + steady(CHANGE_AT + 90.0, CHANGE_AT + 90.0 + seconds, limit, share, **kw)


def test_a_change_that_serves_much_less_is_rolled_back_with_both_windows_figures() -> None:
    # The evidence starts one request lifetime (10 s here) after the batch settled (the second window at 512).
    v = verify(CHANGE_AT, 64, 512, BEFORE, after(512, 0.09, 60.0), CHANGE_AT + 150.0)
    assert v.outcome == Outcome.UNDECIDED  # 15 s of evidence
    v = verify(CHANGE_AT, 64, 512, BEFORE, after(512, 0.09, 75.0), CHANGE_AT + 165.0)
    assert v.outcome == Outcome.ROLL_BACK and v.why == Why.WORSE
    assert v.before is not None and v.after is not None
    assert round(v.before.goodput_per_s, 1) == 16.8 and round(v.after.goodput_per_s, 1) == 2.7
    assert "before, at 64" in v.message and "after, at 512" in v.message


def test_a_moderate_loss_needs_the_full_evidence() -> None:
    assert verify(CHANGE_AT, 64, 512, BEFORE, after(512, 0.40, 90.0), CHANGE_AT + 180.0).outcome == Outcome.UNDECIDED
    assert verify(CHANGE_AT, 64, 512, BEFORE, after(512, 0.40, 105.0), CHANGE_AT + 195.0).outcome == Outcome.ROLL_BACK


def test_a_better_change_is_kept_only_after_enough_evidence() -> None:
    early = verify(CHANGE_AT, 64, 256, BEFORE, after(256, 0.80, 90.0), CHANGE_AT + 180.0)
    assert early.outcome == Outcome.UNDECIDED and early.why == Why.TOO_LITTLE_EVIDENCE
    late = verify(CHANGE_AT, 64, 256, BEFORE, after(256, 0.80, KEEP_SECONDS + 45), CHANGE_AT + 300.0)
    assert late.outcome == Outcome.KEEP and late.why == Why.BETTER


def test_an_equal_change_is_kept_not_rolled_back() -> None:
    v = verify(CHANGE_AT, 64, 128, BEFORE, after(128, 0.55, KEEP_SECONDS + 45), CHANGE_AT + 300.0)
    assert v.outcome == Outcome.KEEP and v.why == Why.NO_WORSE


def test_the_rollout_and_the_filling_batch_are_not_evidence() -> None:
    """A raised batch fills over a request's lifetime; a TPOT cliff shows only once it is full. The windows
    while the pods run mixed limits, and while the batch still grows, count neither way."""
    filling = [window(CHANGE_AT + 90.0 + k * INTERVAL, 512, 0.9, batch=64.0 * 1.5 ** k) for k in range(1, 6)]
    v = verify(CHANGE_AT, 64, 512, BEFORE, ROLLING + filling, CHANGE_AT + 165.0)
    assert v.outcome == Outcome.UNDECIDED and v.why == Why.SETTLING
    full = [window(CHANGE_AT + 165.0 + k * INTERVAL, 512, 0.09, batch=500.0) for k in range(1, 7)]
    caught = verify(CHANGE_AT, 64, 512, BEFORE, ROLLING + filling + full, CHANGE_AT + 255.0)
    assert caught.outcome == Outcome.ROLL_BACK
    assert caught.after is not None and caught.after.share < 0.2  # the filling windows' 90% did not count


def test_scrape_gaps_are_skipped_not_read_as_a_loss() -> None:
    """Windows from fewer pods than serve (failed scrapes) show a fraction of the traffic: never evidence."""
    gaps = [window(CHANGE_AT + 90.0 + k * INTERVAL, 512, 0.0, pods=1) for k in range(1, 12)]
    v = verify(CHANGE_AT, 64, 512, BEFORE, ROLLING + gaps, CHANGE_AT + 270.0)
    assert v.outcome == Outcome.UNDECIDED
    mixed = ROLLING + [w for pair in zip(gaps, steady(CHANGE_AT + 90.0, CHANGE_AT + 300.0, 512, 0.57)) for w in pair]
    assert verify(CHANGE_AT, 64, 512, BEFORE, mixed, CHANGE_AT + 300.0).outcome != Outcome.ROLL_BACK


def test_a_pod_restarted_by_something_else_is_not_a_loss() -> None:
    """A pod killed (OOM, node drain) in a window loses what it held; that window says nothing of the limit."""
    windows = after(256, 0.60, 2 * KEEP_SECONDS)
    hit = [w if k % 3 or w.limit is None else window(w.end_s, 256, 0.05, restarted=True)
           for k, w in enumerate(windows)]
    v = verify(CHANGE_AT, 64, 256, BEFORE, hit, CHANGE_AT + 90.0 + 2 * KEEP_SECONDS)
    assert v.outcome == Outcome.KEEP and v.after is not None and v.after.share > 0.55


def test_a_counter_reset_is_not_a_loss() -> None:
    """A counter that went back reads as a restart (the sampler flags it); a window of non-finite or negative
    figures is never evidence either."""
    reset = window(CHANGE_AT + 105.0, 256, 0.0, restarted=True)
    junk = WindowFigures(CHANGE_AT + 120.0, INTERVAL, 256, 2, 2, -5.0, 10.0, float("nan"), 0.0)
    v = verify(CHANGE_AT, 64, 256, BEFORE, ROLLING + [reset, junk] + steady(CHANGE_AT + 120.0, CHANGE_AT + 300.0,
                                                                               256, 0.56), CHANGE_AT + 300.0)
    assert v.outcome == Outcome.KEEP and v.after is not None and v.after.share > 0.5


def test_a_load_change_during_the_window_is_not_a_rollback() -> None:
    """The load doubled after the change: the share served in time falls whatever the limit; no verdict, and
    once the deadline passes the change is kept, unverified (a rollback needs a measured loss)."""
    heavier = after(512, 0.3, 300.0, rate=60.0)
    v = verify(CHANGE_AT, 64, 512, BEFORE, heavier, CHANGE_AT + 390.0)
    assert v.outcome == Outcome.UNDECIDED and v.why == Why.LOAD_CHANGED
    mix = after(512, 0.3, 300.0, prompt=2000.0, output=300.0)  # the same rate, a RAG mix instead of chat
    assert verify(CHANGE_AT, 64, 512, BEFORE, mix, CHANGE_AT + 390.0).why == Why.LOAD_CHANGED
    done = verify(CHANGE_AT, 64, 512, BEFORE, heavier, CHANGE_AT + GIVE_UP_SECONDS)
    assert done.outcome == Outcome.KEEP and done.why == Why.GAVE_UP


def test_without_a_baseline_there_is_no_rollback() -> None:
    v = verify(CHANGE_AT, 64, 512, [], after(512, 0.0, 120.0), CHANGE_AT + 240.0)
    assert v.outcome == Outcome.UNDECIDED and v.why == Why.NO_BASELINE
    partial = [window(w.end_s, 64, w.served_share, pods=1) for w in BEFORE]  # the baseline was a partial view
    assert verify(CHANGE_AT, 64, 512, partial, after(512, 0.0, 120.0), CHANGE_AT + 240.0).why == Why.NO_BASELINE


def _noisy(rng: random.Random, start_s: float, end_s: float, limit: int, p: float, rate: float) -> list[WindowFigures]:
    out, t = [], start_s + INTERVAL
    while t <= end_s:
        offered = max(1, round(rng.gauss(rate * INTERVAL, (rate * INTERVAL) ** 0.5)))
        good = sum(1 for _ in range(offered) if rng.random() < p)
        # Windows are not independent requests: a burst makes a whole window worse; add that scatter too.
        good = max(0, min(offered, round(good * rng.uniform(0.9, 1.1))))
        out.append(WindowFigures(t, INTERVAL, limit, 2, 2, offered, offered, good, offered, 100.0, 20.0, 150.0,
                                 600.0))
        t += INTERVAL
    return out


# Derandomized: the property is statistical (a noise bound), and a random search of seeds finds tail draws; the one
# found on 2026-12-02 is kept below as a known false rollback.
@settings(max_examples=200, deadline=None, derandomize=True)
@given(p=st.floats(0.05, 1.0), rate=st.floats(1.0, 60.0), seed=st.integers(0, 10**6))
def test_steady_noise_never_rolls_back(p: float, rate: float, seed: int) -> None:
    """The same engine serving the same traffic before and after (a change that changed nothing): whatever the
    draw, the verdict is never a rollback, at every interval of the verification."""
    _steady(p, rate, seed)


# Steady draws at 1-5 req/s near those on which a random search found false rollbacks while the noise bound took
# the larger of the binomial error and the window floor instead of their sum (autotune/verify.noise; issue 18). The
# search's p and rate were rounded here, which makes other draws; one of those still rolls back, kept as a strict xfail.
KNOWN_FALSE_ROLLBACK = pytest.mark.xfail(strict=True, reason=(
    "a known false rollback: the baseline's windows drew 88% in time against a true 76% (all 20 drew 84%), the "
    "evidence 64-68% over four judged windows in a row at 1.03-1.21x the bound: a loss that holds, which no "
    "confirmation on the next window tells from a real one (issue 18, open)"))
# Draws that rolled back on one judged window, each within 1.14x its bound, before a loss on thin evidence had to
# hold on the next one (verify.confirm; 9 of the 13 false rollbacks in 200,000 steady draws at 1-5 req/s, 2026-12-03).
CONFIRMED_AWAY = [(0.5887217074959454, 2.153941856552137, 877172), (0.6505106170617216, 1.1657536162802598, 782344),
                  (0.657430447059396, 1.7336259762461954, 116275), (0.7336027093470906, 3.046970343825335, 226253),
                  (0.56388340604048, 1.544877566506421, 867919), (0.6937582450343475, 1.3662507359613731, 648999),
                  (0.5330713473009719, 1.3136803233540073, 353018), (0.43974730715269167, 1.8714991798848186, 661186),
                  (0.44202783395905443, 1.266068772387229, 850433)]
LOW_RATE_DRAWS = [(0.8125, 1.0, 4382), (0.487, 1.44, 679478), pytest.param(0.764, 1.92, 611804, marks=KNOWN_FALSE_ROLLBACK),
                  (0.8736754600959129, 1.3795982625704721, 659503), (0.687, 3.75, 581084), (0.534, 2.83, 55859),
                  *CONFIRMED_AWAY]


@pytest.mark.parametrize("p,rate,seed", LOW_RATE_DRAWS)
def test_steady_noise_at_a_few_requests_per_second_never_rolls_back(p: float, rate: float, seed: int) -> None:
    _steady(p, rate, seed)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(p=st.floats(0.05, 1.0), rate=st.floats(1.0, 5.0), seed=st.integers(0, 10**6))
def test_steady_noise_at_low_rates_never_rolls_back(p: float, rate: float, seed: int) -> None:
    """Where a window holds 15-75 requests, its binomial scatter and the bursts' are of a size."""
    _steady(p, rate, seed)


def test_a_cliff_at_a_few_requests_per_second_is_still_rolled_back_and_soon() -> None:
    """The wider bound at low rates still catches issue 18's cliff (56% in time -> 9%): at 2 req/s on 30 s of
    evidence, as at 30 req/s (1.57x its bound: no confirmation); at 1 req/s the first look (45 requests, 1.41x the
    bound) waits for the next window, 15 s later."""
    slow = steady(0.0, CHANGE_AT, 64, 0.56, rate=2.0)
    v = verify(CHANGE_AT, 64, 512, slow, after(512, 0.09, 75.0, rate=2.0), CHANGE_AT + 165.0)
    assert v.outcome == Outcome.ROLL_BACK and v.why == Why.WORSE, v.message
    slower = steady(0.0, CHANGE_AT, 64, 0.56, rate=1.0)
    first = verify(CHANGE_AT, 64, 512, slower, after(512, 0.09, 90.0, rate=1.0), CHANGE_AT + 180.0)
    assert first.outcome == Outcome.UNDECIDED and "thin evidence" in first.message, first.message
    v = verify(CHANGE_AT, 64, 512, slower, after(512, 0.09, 105.0, rate=1.0), CHANGE_AT + 195.0)
    assert v.outcome == Outcome.ROLL_BACK and v.why == Why.WORSE, v.message


def test_a_loss_near_its_bound_on_thin_evidence_must_hold_on_the_next_window_too() -> None:
    """At 5 req/s (75 requests a window) a 20-point loss first clears its bound by 1.13x: it rolls back when the
    next judged window is judged a rollback too, one interval later; a dip that does not hold never rolls back."""
    slow = steady(0.0, CHANGE_AT, 64, 0.56, rate=5.0)
    first = verify(CHANGE_AT, 64, 512, slow, after(512, 0.36, 105.0, rate=5.0), CHANGE_AT + 195.0)
    assert first.outcome == Outcome.UNDECIDED and "judged on 1 window(s) in a row of the 2" in first.message
    v = verify(CHANGE_AT, 64, 512, slow, after(512, 0.36, 120.0, rate=5.0), CHANGE_AT + 210.0)
    assert v.outcome == Outcome.ROLL_BACK and v.why == Why.WORSE, v.message
    dip = after(512, 0.36, 105.0, rate=5.0) + steady(CHANGE_AT + 195.0, CHANGE_AT + 330.0, 512, 0.60, rate=5.0)
    verdicts = [verify(CHANGE_AT, 64, 512, slow, dip[:k], dip[k - 1].end_s) for k in range(1, len(dip) + 1)]
    assert Outcome.ROLL_BACK not in {v.outcome for v in verdicts} and verdicts[-1].outcome == Outcome.KEEP


def test_at_tens_of_requests_per_second_a_loss_near_its_bound_rolls_back_on_one_look() -> None:
    """450 requests a window are no thin evidence: a 16-point loss at 1.17x its bound rolls back at once."""
    v = verify(CHANGE_AT, 64, 512, BEFORE, after(512, 0.40, 105.0), CHANGE_AT + 195.0)
    assert v.outcome == Outcome.ROLL_BACK and v.why == Why.WORSE, v.message


def _first_rollback(p0: float, p1: float, rate: float, seed: int) -> float | None:
    """Noisy windows at ``p0`` before and ``p1`` after the change, judged at every interval as the operator does
    (a Keep ends the watch): the seconds from the change to the rollback (None: none)."""
    rng = random.Random(seed)
    base = Baseline()
    for w in _noisy(rng, 0.0, CHANGE_AT, 64, p0, rate):
        base = base.observe(w, 64)
    state = watch(base, 64, 128, CHANGE_AT)
    for w in ROLLING + _noisy(rng, CHANGE_AT + 90.0, CHANGE_AT + 690.0, 128, p1, rate):
        state = state.observe(w)
        outcome = state.verdict(w.end_s).outcome
        if outcome != Outcome.UNDECIDED:
            return w.end_s - CHANGE_AT if outcome == Outcome.ROLL_BACK else None
    return None


def test_real_losses_at_a_few_requests_per_second_in_noisy_windows_are_caught_within_an_interval_or_two() -> None:
    """The property's generator, 200 seeds: issue 18's cliff at 2 req/s is rolled back 180 s after the change
    (the second settled window) in most runs and by 225 s in all that had a baseline; a 20-point loss at 5 req/s
    in 95% of the runs. Measured over 2,000 seeds (2026-12-03): the cliff's mean 180.2 s -> 183.8 s, the 20-point
    loss's 210.0 s -> 226.3 s, against one look per window."""
    caught = sorted(t for t in (_first_rollback(0.56, 0.09, 2.0, seed) for seed in range(200)) if t is not None)
    assert len(caught) >= 198 and caught[len(caught) // 2] == 180.0 and caught[-1] <= 225.0
    moderate = [t for t in (_first_rollback(0.56, 0.36, 5.0, seed) for seed in range(200)) if t is not None]
    assert len(moderate) >= 190 and max(moderate) <= 300.0


def _steady(p: float, rate: float, seed: int) -> None:
    rng = random.Random(seed)
    before = _noisy(rng, 0.0, CHANGE_AT, 64, p, rate)
    later = _noisy(rng, CHANGE_AT + 90.0, CHANGE_AT + 90.0 + KEEP_SECONDS + 60, 128, p, rate)
    for k in range(len(later) + 1):
        v = verify(CHANGE_AT, 64, 128, before, ROLLING + later[:k], CHANGE_AT + 90.0 + k * INTERVAL)
        assert v.outcome != Outcome.ROLL_BACK, v.message


def test_a_canary_worse_than_the_old_pods_is_rolled_back_and_an_equal_one_promoted() -> None:
    started = 600.0
    old = steady(started - 60.0, started + 400.0, 64, 0.55, pods=1, expected=1)
    bad = steady(started + 90.0, started + 300.0, 512, 0.10, pods=1, expected=1, batch=450.0)
    v = verify_canary(64, 512, bad, old, started, started + 300.0)
    assert v.outcome == Outcome.ROLL_BACK and "canary at 512" in v.message
    good = steady(started + 90.0, started + 400.0, 256, 0.57, pods=1, expected=1, batch=200.0)
    early = verify_canary(64, 256, good[:4], old, started, started + 150.0)
    assert early.outcome == Outcome.UNDECIDED
    assert verify_canary(64, 256, good, old, started, started + 400.0).outcome == Outcome.KEEP


def test_a_thin_canary_loss_waits_one_window_and_its_streak_round_trips_through_status() -> None:
    """A canary pod at 4 req/s (60 requests a window) serving 10% in time beside pods at 55%: its first look
    (1.4x the bound) waits for the next window, 15 s later, and the streak survives status between the two."""
    from kvpilot.desired.canary import canary_of, canary_record

    started = 600.0
    old = steady(started - 60.0, started + 400.0, 64, 0.55, pods=1, expected=1, rate=4.0)
    bad = steady(started + 90.0, started + 400.0, 512, 0.10, pods=1, expected=1, batch=450.0, rate=4.0)
    by_end = {w.end_s: w for w in old}
    state = CanaryWatch(started, 64, 512)
    for w in bad[:5]:
        state = state.observe(w, by_end[w.end_s])
    assert state.worse == 1 and state.verdict(started + 165.0).outcome == Outcome.UNDECIDED
    record = canary_record(Canary(Phase.RUNNING, 64, 512, started, True, watch=state), None, "p", None)
    back = canary_of(AutotuneStatus(canary=record), datetime.fromtimestamp(started + 165.0, timezone.utc))
    assert back is not None and back.judged.worse == 1
    assert back.judged.observe(bad[5], by_end[bad[5].end_s]).verdict(started + 180.0).outcome == Outcome.ROLL_BACK
    assert verify_canary(64, 512, bad[:6], old, started, started + 180.0).outcome == Outcome.ROLL_BACK


def test_a_watchs_streak_round_trips_through_status_and_a_forged_one_is_bounded() -> None:
    from kvpilot.desired.verifying import memory_of, verification_status

    base = Baseline()
    for w in steady(0.0, CHANGE_AT, 64, 0.56, rate=5.0):
        base = base.observe(w, 64)
    state = watch(base, 64, 512, CHANGE_AT)
    for w in after(512, 0.36, 105.0, rate=5.0):
        state = state.observe(w)
    assert state.worse == 1 and state.verdict(CHANGE_AT + 195.0).outcome == Outcome.UNDECIDED
    now = datetime.fromtimestamp(CHANGE_AT + 195.0, timezone.utc)
    record = verification_status(Memory(baseline=base, watch=state), None)
    back = memory_of(AutotuneStatus(verification=record), now).watch
    assert record.watch is not None and record.watch.worse_windows == 1 and back is not None and back.worse == 1
    assert back.observe(window(CHANGE_AT + 210.0, 512, 0.36, rate=5.0)).verdict(CHANGE_AT + 210.0).outcome \
        == Outcome.ROLL_BACK
    for forged, read in ((-4, 0), (10**6, 2)):
        hostile = replace(record, watch=replace(record.watch, worse_windows=forged))
        assert memory_of(AutotuneStatus(verification=hostile), now).watch.worse == read  # type: ignore[union-attr]


def test_a_canary_is_judged_against_the_same_windows_so_a_load_change_moves_both_sides() -> None:
    started = 600.0
    old = steady(started, started + 400.0, 64, 0.30, pods=1, expected=1, rate=60.0)
    canary = steady(started + 90.0, started + 400.0, 128, 0.31, pods=1, expected=1, rate=60.0, batch=120.0)
    assert verify_canary(64, 128, canary, old, started, started + 400.0).outcome == Outcome.KEEP


def test_a_rollback_bars_the_failed_half_of_that_direction_then_all_of_it() -> None:
    first = bar_after_rollback(64, 512, 500.0, 1800.0)
    assert first == Bar(True, 182, 2300.0)  # ceil(sqrt(64 * 512)) = ceil(181.02)
    assert first.refuses(64, 256, 600.0) and first.refuses(64, 182, 600.0)
    assert not first.refuses(64, 128, 600.0)  # half as far, in ratio, may still be tried
    assert not first.refuses(64, 32, 600.0)  # the other direction is not barred
    assert not first.refuses(64, 512, 2300.0)  # the horizon is over
    second = bar_after_rollback(64, 128, 900.0, 1800.0, [first])
    assert second.refuses(64, 65, 1000.0) and not second.refuses(64, 48, 1000.0)
    lower = bar_after_rollback(512, 64, 0.0, 1800.0)
    assert lower.refuses(512, 181, 10.0) and not lower.refuses(512, 182, 10.0)


def test_the_baseline_follows_the_limit_and_the_load_and_weighs_the_recent_windows_most() -> None:
    base = Baseline()
    for w in steady(0.0, 600.0, 64, 0.5):
        base = base.observe(w, 64)
    assert base.limit == 64 and base.side.seconds <= 4 * 120.0  # faded: about the last two to four minutes
    assert round(base.side.share, 3) == 0.5
    assert base.observe(None, 64) == base and base.observe(window(615.0, 64, 0.5, pods=1), 64) == base
    heavier = base.observe(window(615.0, 64, 0.2, rate=60.0), 64)  # the load doubled: start again from it
    assert heavier.side.windows == 1 and round(heavier.side.share, 2) == 0.2
    other = base.observe(window(615.0, 128, 0.5), 128)  # another limit: another baseline, once it has settled
    assert other.limit == 128 and other.side.windows == 0
    for k in range(2, 6):
        other = other.observe(window(600.0 + 15 * k, 128, 0.5), 128)
    assert other.side.windows == 2  # the first window, and one latency after the batch settled, are no baseline


def test_a_quiet_window_at_a_low_rate_is_not_a_load_change() -> None:
    from kvpilot.autotune.verify import Side, comparable

    base = Side()
    for w in steady(0.0, 300.0, 64, 0.9, rate=1.0):
        base = base.add(w)
    assert comparable(window(315.0, 64, 0.9, rate=0.6), base)  # 9 arrivals where 15 were expected: chance
    assert not comparable(window(315.0, 64, 0.9, rate=3.0), base)
    busy = Side().add(window(15.0, 64, 0.9, rate=60.0))
    assert not comparable(window(30.0, 64, 0.9, rate=45.0), busy)  # 25% fewer of 900: a change


def test_under_bursty_arrivals_a_window_scatters_cv_times_more_before_it_is_a_load_change() -> None:
    """Gamma arrivals of cv 3 at 8 req/s (burst-a100): 120 expected in a 15 s window scatter by about 3 x 11."""
    from kvpilot.autotune.verification import _cv, figures_from_window
    from kvpilot.autotune.verify import Side, comparable
    from kvpilot.autotune.window import KvWindow

    base = Side()
    for w in steady(0.0, 300.0, 64, 0.9, rate=8.0):
        base = base.add(w)
    burst = window(315.0, 64, 0.9, rate=13.0)  # 195 arrivals where 120 were expected
    assert not comparable(burst, base)
    assert comparable(replace(burst, arrival_cv=3.0), base)
    assert not comparable(replace(window(315.0, 64, 0.9, rate=30.0), arrival_cv=3.0), base)  # 3.75x: a new load
    assert [_cv(x) for x in (None, float("nan"), 0.7, 2.5)] == [1.0, 1.0, 1.0, 2.5]
    kv = KvWindow(samples=3, pods=2, peak_utilization=0.2, mean_utilization=0.2, peak_used_blocks=10, max_blocks=50,
                  tokens_per_block=32, peak_active=4, mean_active=3.0, peak_queued=0, mean_queued=0.0, paused=0,
                  runtime_batch_size=64, window_seconds=15.0, arrival_rate=4.0, arrival_cv=3.0)
    assert figures_from_window(kv, 15.0, 64, 2).arrival_cv == 3.0


@pytest.mark.parametrize("rate,share", [(30.0, 0.09), (5.0, 0.36)])
def test_one_window_at_a_time_gives_the_verdict_of_the_whole_sequence(rate: float, share: float) -> None:
    """The state kept in status between decisions (verification.Watch) reaches the same verdict, at every
    interval, as the windows judged together (at 5 req/s through a loss confirmed on a second window)."""
    later = after(512, share, 120.0, rate=rate)
    before = steady(0.0, CHANGE_AT, 64, 0.56, rate=rate)
    base = Baseline()
    for w in before:
        base = base.observe(w, 64)
    state = watch(base, 64, 512, CHANGE_AT)
    for k, w in enumerate(later):
        state = state.observe(w)
        assert state.verdict(w.end_s) == verify(CHANGE_AT, 64, 512, before, later[:k + 1], w.end_s)
