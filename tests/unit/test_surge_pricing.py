"""A raise rolled with surge is priced as surge rolls it (autotune/costs.py ``worth_a_restart``): the old pods serve
until the new ones are Ready, so no backlog grows and only the switch costs. Measured where it mattered: document
Q&A then chat with a spare GPU (docs/tuner-suite.md, "Tenth pass")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvpilot.autotune.costs import restart_cost_seconds, worth_a_restart
from kvpilot.autotune.inputs import ChangeCost
from kvpilot.autotune.window import KvWindow

ROLLING = ChangeCost(replicas=2, restart_seconds=90.0)
SURGE = replace(ROLLING, surge=True)


def chat_arrives(misses: float) -> KvWindow:
    """The batch full at 64 with a queue of 20, the pool nearly empty: chat traffic 30 req/s over two pods."""
    return KvWindow(samples=12, pods=2, peak_utilization=0.07, mean_utilization=0.05, peak_used_blocks=800,
                    max_blocks=12000, tokens_per_block=32, peak_active=64, mean_active=64.0, peak_queued=25,
                    mean_queued=20.0, paused=0, runtime_batch_size=64, window_seconds=15.0, completion_rate=12.0,
                    arrival_rate=15.5, prompt_mean=150.0, output_mean=510.0, ttft_miss_fraction=misses,
                    tpot_miss_fraction=0.0, active_limit=64, full_waiting_share=1.0)


def caused(verdict: str) -> float:
    return float(verdict.split("caused ")[1].split("s of")[0])


@pytest.mark.parametrize("misses", [0.11, 0.18, 0.23])
def test_chat_s_arrival_pays_for_a_surge_raise_at_once(misses: float) -> None:
    """Measured: 11%, 18% and 23% of the requests missed TTFT in chat's first windows; priced as a rolling restart
    none paid (196-409 s avoided against 410-470 s caused) and the raise waited 75 s."""
    w = chat_arrives(misses)
    rolling_ok, rolling = worth_a_restart(ROLLING, 64, w, misses, 256)
    ok, why = worth_a_restart(SURGE, 64, w, misses, 256)
    assert ok and "(surge)" in why, why
    assert caused(why) < caused(rolling) / 10  # no backlog: a rolling restart's price is ten times and more
    if misses < 0.15:
        assert not rolling_ok, rolling  # the first window of chat: priced as rolling, it did not pay
    # the switch alone: a tenth of each pod's start, for the requests that would have been served
    assert caused(why) == pytest.approx(restart_cost_seconds(SURGE, 1.0) * (1 - misses), abs=0.5)


def test_a_surge_raise_still_needs_misses_that_outlast_the_new_pods_start() -> None:
    # misses that only go on while the new pods start are not avoided by starting them
    assert not worth_a_restart(SURGE, 64, chat_arrives(0.2), 0.2, 256, horizon=SURGE.restart_seconds)[0]
    ok, why = worth_a_restart(SURGE, 64, chat_arrives(0.2), 0.2, 256, horizon=2 * SURGE.restart_seconds)
    assert ok and why.startswith("expected misses avoided 18s"), why  # the horizon past the start counts
    # a few misses pay for the switch only over a long enough horizon: 0.5% over 30 minutes is 8.6 s, the
    # switch 17.9 s of traffic
    assert not worth_a_restart(SURGE, 64, chat_arrives(0.005), 0.005, 256)[0]
