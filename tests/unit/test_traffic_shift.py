"""A change the what-if would size waits while the traffic's mix is shifting (autotune/shift.py, policy._settled).

Lengths come from finished requests, so right after a phase shift they mix the old traffic's with the new: on the
suite's document Q&A then chat case without a spare GPU, a raise sized 15 s after chat arrived stopped at 60-80
and a second rolling restart followed. Protective changes and rollbacks never wait.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from kvpilot.api.status import EngineStatus, KvCacheStatus, TrafficStatus
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.policy import decide
from kvpilot.autotune.shift import MIN_SHIFT_REQUESTS, SeenTraffic, lengths_moving, shift_factor
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.tuning import last_traffic
from tests.unit.test_autotune_rollback import MODEL, NOW, inp, kv

DOCUMENTS = SeenTraffic(rate_per_pod=4.0, prompt_mean=2000.0, output_mean=210.0)  # the Q&A window before


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
        assert ("arrival rate moved" in why) == (before is not None and abs(before.rate_per_pod / window.arrival_rate - 1) > 0.5)


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


def test_a_raise_the_what_if_would_size_waits_while_the_mix_shifts(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpilot.autotune.policy as policy

    sized: list[Any] = []

    def verdict(*args: Any, **_kw: Any) -> tuple[int, str]:
        sized.append(args)
        return 256, "simulated"

    monkeypatch.setattr(policy, "what_if_verdict", verdict)
    base = inp(current=32, w=chat(), last_applied_at=NOW - timedelta(hours=1), what_if=WhatIfGate(model=MODEL))
    shifting = replace(base, history=replace(base.history, last_traffic=DOCUMENTS))
    d = decide(shifting)
    assert (d.action, d.reason) == ("Hold", "TrafficShifting"), d.message
    assert "mean prompt moved 2000 -> 1000" in d.message and not sized
    settled = replace(base, history=replace(base.history, last_traffic=SeenTraffic(30.0, 1000.0, 450.0)))
    d = decide(settled)
    assert (d.action, d.target) == ("Raise", 256) and len(sized) == 1, d.message
    no_model = replace(shifting, what_if=WhatIfGate())  # the rules alone do not size on lengths
    assert decide(no_model).action == "Raise"


def test_a_protective_lower_never_waits_for_the_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpilot.autotune.policy as policy

    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: (None, "no gain"))
    broken = replace(kv(active=512, tpot=130.0, tpot_misses=0.9), prompt_mean=1000.0, output_mean=300.0)
    base = inp(current=512, w=broken, last_applied_at=NOW - timedelta(hours=1), what_if=WhatIfGate(model=MODEL))
    d = decide(replace(base, history=replace(base.history, last_traffic=SeenTraffic(15.0, 150.0, 600.0))))
    assert (d.action, d.reason) == ("Lower", "TpotObjectiveBroken"), d.message


@pytest.mark.parametrize(("traffic", "seen"), [
    (TrafficStatus(requests_per_minute=240, prompt_tokens=2000, output_tokens=210), SeenTraffic(4.0, 2000.0, 210.0)),
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
    assert last_traffic(EngineStatus(kv_cache=KvCacheStatus(traffic=traffic))) == seen
    assert last_traffic(EngineStatus()) is None
