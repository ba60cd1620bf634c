"""A change the what-if would size waits while the traffic's mix is shifting (autotune/shift.py, policy._settled).

Lengths come from finished requests, so right after a phase shift they mix the old traffic's with the new: on the
suite's document Q&A then chat case without a spare GPU, a raise sized 15 s after chat arrived stopped at 60-80
and a second rolling restart followed. Rollbacks and protective changes never wait, but a TPOT break read on one
window while the mix shifts (no settled minutes at the limit weigh it yet) waits as a change for a gain does.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from kvpilot.api.status import Action, AutotuneStatus, DecisionRecord, EngineStatus, KvCacheStatus, TrafficStatus
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.policy import decide
from kvpilot.autotune.shift import (MAX_SHIFT_WINDOWS, MIN_SHIFT_REQUESTS, RATE_SHIFT, SeenTraffic, lengths_moving,
                                   mix_wait, shift_factor)
from kvpilot.autotune.inputs import TunerInput
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.batching import autotune_status
from kvpilot.desired.tuning import last_traffic, shifting_since
from kvpilot.api.timestamps import rfc3339
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.whatif import WhatIf
from kvpilot.autotune.verification import Baseline, Memory
from tests.unit.test_autotune_rollback import MODEL, NOW, figures, inp, kv

DOCUMENTS = SeenTraffic(rate_per_pod=4.0, prompt_mean=2000.0, output_mean=210.0, age_s=15.0)  # the Q&A window before


def chat(prompt: float = 1000.0, output: float = 450.0, finished_per_pod: float = 15.0,
         arrivals_per_pod: float = 15.0) -> KvWindow:
    """The batch full at 32 with a queue and most requests missing TTFT, TPOT far inside its objective; the lengths
    those that finished in the window had."""
    return replace(kv(active=32, tpot=9.0), peak_active=32, mean_active=32.0, runtime_batch_size=32, mean_queued=20.0,
                   ttft_miss_fraction=0.57, peak_utilization=0.16, mean_utilization=0.1, arrival_rate=arrivals_per_pod,
                   completion_rate=finished_per_pod, prompt_mean=prompt, output_mean=output)


# The window that caught the shift halfway, as the suite measured it (rag-then-chat-a100 on the all-slow engine,
# from 2048, the first window of chat): arrivals 3.8 -> 14.9 req/s per pod, finished lengths 1.4x.
HALFWAY = chat(prompt=1342.0, output=445.0, finished_per_pod=4.13, arrivals_per_pod=14.87)


@pytest.mark.parametrize(("before", "window", "moved"), [
    (DOCUMENTS, chat(prompt=1000.0, output=450.0), "prompt"),  # 15 s after chat arrived
    (SeenTraffic(15.0, 1000.0, 450.0), chat(prompt=180.0, output=520.0), "prompt"),  # 15 s later
    (SeenTraffic(15.0, 150.0, 220.0), chat(prompt=150.0, output=520.0), "output"),
    (SeenTraffic(15.0, 180.0, 520.0), chat(prompt=140.0, output=560.0), None),  # settled: within the noise
    (SeenTraffic(15.0, 140.0 * shift_factor(450) * 0.99, 520.0), chat(prompt=140.0, output=520.0), None),
    (None, chat(), None),  # nothing seen before
    (SeenTraffic(0.5, 2000.0, 210.0), chat(prompt=150.0), None),  # too few requests before to tell
    (DOCUMENTS, chat(prompt=150.0, finished_per_pod=0.9), None),  # too few finished now to tell
    (DOCUMENTS, replace(chat(), prompt_mean=0.0), None),  # no lengths now
    (SeenTraffic(15.0, 2000.0, 210.0), chat(1300.0, 450.0, finished_per_pod=2.0), "output"),  # 60 requests: 2.1x
    (SeenTraffic(15.0, 2000.0, 210.0), chat(1300.0, 300.0, finished_per_pod=2.0), None),  # 60 requests: 1.5x
    (SeenTraffic(3.83, 1894.0, 300.0), HALFWAY, "prompt"),  # the rate leads: 1.4x is a shift beside it
    (SeenTraffic(14.87, 1894.0, 300.0), HALFWAY, None),  # the same lengths at the same rate: maybe noise
    (SeenTraffic(7.5, 700.0, 300.0), chat(760.0, 280.0), None),  # a ramp: the rate doubled, the mix did not move
])
def test_the_mix_is_moving_when_a_mean_length_moved_by_the_shift_factor_over_enough_requests(
    before: SeenTraffic | None, window: KvWindow, moved: str | None,
) -> None:
    why = lengths_moving(before, window)
    if moved is None:
        assert why is None, why
    else:
        assert why is not None and f"mean {moved} moved" in why
        rates = (before.rate_per_pod, window.arrival_rate) if before is not None else (1.0, 1.0)
        assert ("arrival rate moved" in why) == (max(rates) >= RATE_SHIFT * min(rates))


@pytest.mark.parametrize("requests", [MIN_SHIFT_REQUESTS, 50, 100, 200])
def test_two_windows_of_the_same_traffic_rarely_read_as_a_shift(requests: int) -> None:
    """The factor against sampling noise: lognormal lengths with a chat-like spread (sigma 0.8), two windows of
    ``requests`` requests each; their means differ by shift_factor in under 1 in 1,000 pairs."""
    rng, sigma, mean, trials = random.Random(requests), 0.8, 600.0, 6000
    mu = math.log(mean) - sigma * sigma / 2
    factor = shift_factor(requests)

    def window_mean() -> float:
        return sum(rng.lognormvariate(mu, sigma) for _ in range(requests)) / requests

    shifted = sum(1 for _ in range(trials) if max(a := window_mean(), b := window_mean()) >= factor * min(a, b))
    assert shifted <= trials // 1000, shifted


@pytest.mark.parametrize("requests", [MIN_SHIFT_REQUESTS, 100, 200])
def test_a_ramp_of_the_same_mix_rarely_waits(requests: int) -> None:
    """The rate doubled, the mix did not move: only the noise of both lengths (sigma 0.8) reads as a shift, at
    half the margin, in under 10% of such windows (docs/live-tuner.md, item 9)."""
    rng, sigma, trials = random.Random(requests + 1), 0.8, 1500

    def mean(of: float) -> float:
        mu = math.log(of) - sigma * sigma / 2
        return sum(rng.lognormvariate(mu, sigma) for _ in range(requests)) / requests

    per_pod = requests / 15.0 / 2  # two pods, a 15 s window
    waits = 0
    for _ in range(trials):
        before = SeenTraffic(per_pod, mean(700.0), mean(300.0), age_s=15.0)
        now = chat(mean(700.0), mean(300.0), finished_per_pod=2 * per_pod, arrivals_per_pod=2 * per_pod)
        waits += lengths_moving(before, now) is not None
    assert waits <= 0.10 * trials, waits


def sizing(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The what-if's verdict replaced by one that records its calls and chooses 256."""
    import kvpilot.autotune.policy as policy

    calls: list[Any] = []

    def verdict(*args: Any, **_kw: Any) -> WhatIf:
        calls.append(args)
        return WhatIf(256, "simulated")

    monkeypatch.setattr(policy, "what_if_verdict", verdict)
    return calls


def raising(last: SeenTraffic | None, since: datetime | None = None, w: KvWindow | None = None) -> TunerInput:
    base = inp(current=32, w=w or chat(), last_applied_at=NOW - timedelta(hours=1), what_if=WhatIfGate(model=MODEL))
    return replace(base, history=replace(base.history, last_traffic=last, shifting_since=since))


def test_a_raise_the_what_if_would_size_waits_while_the_mix_shifts(monkeypatch: pytest.MonkeyPatch) -> None:
    sized = sizing(monkeypatch)
    d = decide(raising(DOCUMENTS))
    assert (d.action, d.reason) == ("Hold", "TrafficShifting"), d.message
    assert "mean prompt moved 2000 -> 1000" in d.message and not sized
    d = decide(raising(SeenTraffic(15.0, 1000.0, 450.0, age_s=15.0)))
    assert (d.action, d.target) == ("Raise", 256) and len(sized) == 1, d.message
    no_model = replace(raising(DOCUMENTS), what_if=WhatIfGate())  # the rules alone do not size on lengths
    assert decide(no_model).action == "Raise"
    no_fit = raising(DOCUMENTS, w=replace(chat(), arrival_rate=0.0))  # nothing for the what-if to replay either
    assert decide(no_fit).reason != "TrafficShifting"


@pytest.mark.parametrize(("age_s", "holding_s", "missing", "waits"), [
    (15.0, None, 0.3, True),   # the last window, one interval ago: compared
    (15.0, 15.0, 0.3, True),   # still moving a window later: waits on
    (15.0, 15.0 * MAX_SHIFT_WINDOWS, 0.3, False),  # waited its windows: the what-if sizes on what it has
    (15.0, None, 0.6, True),   # most requests missing: the first window still waits ...
    (15.0, 15.0, 0.6, False),  # ... but only one: each costs most of its traffic
    (60.0, None, 0.3, False),  # kept in status while windows went empty: says nothing of the last window
    (None, None, 0.3, False),  # no time, or one in the future: unknown
    (5.0, None, 0.3, False),   # a pass soon after the last (an event): overlapping windows look alike, so no shift read
    (5.0, 15.0, 0.3, True),    # ... but a hold in force holds on until a window's worth has passed
])
def test_the_wait_reads_only_the_last_window_and_lasts_at_most_its_windows(
    age_s: float | None, holding_s: float | None, missing: float, waits: bool,
) -> None:
    before = replace(DOCUMENTS, age_s=age_s)
    w = replace(chat(), ttft_miss_fraction=missing)
    assert (mix_wait(before, w, holding_s, 15.0) is not None) == waits


def test_a_tpot_break_no_settled_minutes_weigh_waits_for_the_mix_and_memory_never_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A TPOT break read on one window while the mix shifts measures the old traffic's batch meeting the new
    prompts: it waits as a change for a gain does, one window when most requests miss, two otherwise, then lowers.
    Paused requests never wait, nor does a break the settled minutes at this limit weigh, nor one in pods still filling."""
    sizing(monkeypatch)
    shifted = SeenTraffic(15.0, 150.0, 600.0, age_s=15.0)
    broken = replace(kv(active=512, tpot=130.0, tpot_misses=0.9), prompt_mean=1000.0, output_mean=300.0)
    base = inp(current=512, w=broken, last_applied_at=NOW - timedelta(hours=1), what_if=WhatIfGate(model=MODEL))

    def after(window: KvWindow, held_s: float | None, **kw: Any) -> Decision:
        since = NOW - timedelta(seconds=held_s) if held_s is not None else None
        given = replace(base, window=window, **kw)
        return decide(replace(given, history=replace(given.history, last_traffic=shifted, shifting_since=since)))

    d = after(broken, None)
    assert (d.action, d.reason, d.keeps_traffic) == ("Hold", "TrafficShifting", True), d.message
    assert "512->256" in d.message and "mean prompt moved 150 -> 1000" in d.message
    d = after(broken, 15.0)  # 90% missing: one window's wait, no more
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    many = replace(broken, tpot_p95_ms=80.0, tpot_miss_fraction=0.3)
    assert after(many, 15.0).reason == "TrafficShifting"
    assert (after(many, 15.0 * MAX_SHIFT_WINDOWS).action, after(many, 30.0).reason) == ("Lower", "TpotObjectiveBroken")
    assert decide(replace(base, history=replace(base.history, last_traffic=replace(shifted, prompt_mean=950.0, output_mean=320.0)))).action \
        == "Lower"  # the mix settled: no wait
    paused = replace(broken, paused=5)  # the pool first: paused requests, whatever TPOT shows
    d = after(paused, None)
    assert (d.action, d.reason) == ("Lower", "RequestsPaused"), d.message
    settled = Memory(baseline=_settled_at(512, NOW.timestamp()))
    d = after(broken, None, history=replace(base.history, verification=settled))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    # Pods still filling since they started (68% of the requests sent so far finished): the lengths move as the
    # short requests finish first, not as the mix shifts, so the break does not wait.
    young = replace(broken, finished_total=136.0, in_pods=64.0)
    d = after(young, None)
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
    # A mild break beside as many TTFT misses trades one for the other: the what-if judges it, so it waits.
    trade = replace(broken, tpot_p95_ms=63.0, tpot_miss_fraction=0.10, ttft_miss_fraction=0.25, mean_queued=5.0)
    d = decide(replace(base, window=trade, history=replace(base.history, last_traffic=shifted)))
    assert (d.reason, d.keeps_traffic) == ("TrafficShifting", False), d.message


def _settled_at(limit: int, now_s: float) -> Baseline:
    """Two minutes of settled windows at ``limit``, 44% of their requests missing: settled minutes that weigh."""
    base = Baseline()
    for k in range(8):
        base = base.observe(figures(now_s - 120.0 + 15.0 * k, limit, 0.56), limit)
    return base


def test_a_run_of_waits_is_dated_from_its_first_and_clears_the_old_traffics_decline() -> None:
    first = NOW - timedelta(seconds=15)
    wait = Decision("Hold", 32, "TrafficShifting", "waiting a window")
    before = AutotuneStatus(what_if_declined_at=rfc3339(NOW - timedelta(seconds=40)))
    out = autotune_status(before, wait, current=32, applied=False, now=first)
    assert out.what_if_declined_at is None
    again = autotune_status(out, wait, current=32, applied=False, now=NOW)
    assert shifting_since(again, NOW) == first  # the same advice is not rewritten: the run's start stays
    assert shifting_since(replace(again, recommendation=replace(again.recommendation or DecisionRecord(),
                                                                action=Action.RAISE)), NOW) is None
    assert shifting_since(AutotuneStatus(), NOW) is None
    future = replace(again.recommendation or DecisionRecord(), at=rfc3339(NOW + timedelta(hours=1)))
    assert shifting_since(replace(again, recommendation=future), NOW) is None


@pytest.mark.parametrize(("traffic", "seen"), [
    (TrafficStatus(requests_per_minute=240, prompt_tokens=2000, output_tokens=210), SeenTraffic(4.0, 2000.0, 210.0, 15.0)),
    (TrafficStatus(requests_per_minute=10**400, prompt_tokens=2000, output_tokens=210), None),  # beyond any float
    (TrafficStatus(requests_per_minute=240, prompt_tokens=0, output_tokens=210), None),
    (TrafficStatus(requests_per_minute=-5, prompt_tokens=2000, output_tokens=210), None),
    (TrafficStatus(requests_per_minute="many", prompt_tokens=2000, output_tokens=210), None),  # type: ignore[arg-type]
    (TrafficStatus(requests_per_minute=True, prompt_tokens=2000, output_tokens=210), None),  # type: ignore[arg-type]
    (TrafficStatus(requests_per_minute=240, prompt_tokens=float("nan"), output_tokens=210), None),  # type: ignore[arg-type]
    (TrafficStatus(), None),
    (None, None),
])
def test_the_last_windows_traffic_is_read_from_status_and_anything_unusable_reads_as_unknown(
    traffic: TrafficStatus | None, seen: SeenTraffic | None,
) -> None:
    observed = rfc3339(NOW - timedelta(seconds=15))
    assert last_traffic(EngineStatus(kv_cache=KvCacheStatus(traffic=traffic, observed_at=observed)), NOW) == seen
    assert last_traffic(EngineStatus(), NOW) is None
    if seen is not None:  # an unreadable time, or one in the future: the age is unknown
        for bad in ("yesterday", rfc3339(NOW + timedelta(minutes=5))):
            status = EngineStatus(kv_cache=KvCacheStatus(traffic=traffic, observed_at=bad))
            assert last_traffic(status, NOW) == replace(seen, age_s=None)


def test_the_record_from_before_the_shift_is_kept_while_the_tuner_waits_for_it() -> None:
    """While the tuner holds for a shifting mix, status keeps the traffic record from before the shift, so the pass
    that ends the wait measures the whole move: window to window, lengths that lag move too little to read."""
    from kvpilot.desired.tuning import kept_through_shift

    before = TrafficStatus(requests_per_minute=1800, prompt_tokens=286, output_tokens=477)
    status = EngineStatus(kv_cache=KvCacheStatus(traffic=before))
    waiting = Decision("Hold", 256, "TrafficShifting", "waiting a window", keeps_traffic=True)
    assert kept_through_shift(status, waiting, NOW) is before
    # A raise's wait rewrites it: the windows waited through pool into the traffic the raise is sized on.
    assert kept_through_shift(status, Decision("Hold", 256, "TrafficShifting", "waiting a window"), NOW) is None
    assert kept_through_shift(status, Decision("Lower", 42, "TpotObjectiveBroken", "lower"), NOW) is None
    assert kept_through_shift(status, Decision("Hold", 256, "NoPressure", "hold"), NOW) is None
    assert kept_through_shift(status, None, NOW) is None  # tuning off: this pass's record
    assert kept_through_shift(EngineStatus(), waiting, NOW) is None  # nothing recorded yet
    # A wait in force since a readable time keeps it; one whose start is unreadable or in the future does not,
    # since the wait's limit counts from that start and against a record kept the lengths would move for ever.
    for at, kept in ((rfc3339(NOW - timedelta(seconds=15)), True), ("yesterday", False),
                     (rfc3339(NOW + timedelta(hours=1)), False)):
        rec = DecisionRecord(action=Action.HOLD, reason="TrafficShifting", at=at)
        held = replace(status, autotune=AutotuneStatus(recommendation=rec))
        assert (kept_through_shift(held, waiting, NOW) is before) == kept, at


def test_a_lower_after_the_wait_is_sized_on_the_traffic_ahead_of_the_record_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass that ends the wait reads the move from the record kept (286 -> 880 tokens), not from the wait's own
    window (718 -> 880, within the noise): the what-if ranks the candidates on the traffic ahead."""
    sized = sizing(monkeypatch)
    w = replace(kv(active=205, tpot=103.0, tpot_misses=0.9), prompt_mean=880.0, output_mean=458.0,
                arrival_rate=3.8, completion_rate=10.0)
    base = inp(current=256, w=w, last_applied_at=NOW - timedelta(hours=1), what_if=WhatIfGate(model=MODEL))
    waited = NOW - timedelta(seconds=15)
    for record, ahead in ((SeenTraffic(16.0, 286.0, 477.0, age_s=15.0), True),
                          (SeenTraffic(4.0, 718.0, 453.0, age_s=15.0), False)):
        d = decide(replace(base, history=replace(base.history, last_traffic=record, shifting_since=waited)))
        assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message
        assert ("the mix is moving" in d.message) == ahead, d.message
    assert len(sized) == 2
