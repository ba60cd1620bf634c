"""A pool over target under MaxUtilization with nothing paused and every request in time: without surge the lower
is a precaution whose restart moves each restarting pod's load onto the others (autotune/rules.py ``_in_time``);
it holds until requests are paused or miss. With surge, or where the pods say nothing of latency, it lowers as
before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvpilot.autotune.policy import decide
from kvpilot.autotune.window import KvWindow
from tests.unit.test_autotune_policy import SLO_SPEC, inp, window


def pool_over_target(ttft: float | None, tpot: float | None, paused: int = 0) -> KvWindow:
    return replace(window(util=0.99, active=64, queued=2, paused=paused), ttft_miss_fraction=ttft,
                   tpot_miss_fraction=tpot)


def maxutil(w: KvWindow, surge: bool) -> tuple[str, str, str]:
    d = decide(inp(current=64, spec=SLO_SPEC, scheduler_policy="MaxUtilization", w=w, surge=surge))
    return d.action, d.reason, d.message


def test_without_surge_a_pool_over_target_with_every_request_in_time_holds_and_says_why() -> None:
    action, reason, message = maxutil(pool_over_target(0.0, 0.01), surge=False)
    assert (action, reason) == ("Hold", "NotWorthARestart"), message
    assert "99% peak" in message and "nothing was paused" in message and "without surge" in message


def test_with_surge_the_same_window_lowers() -> None:
    action, reason, message = maxutil(pool_over_target(0.0, 0.0), surge=True)
    assert (action, reason) == ("Lower", "KvCachePressure"), message


@pytest.mark.parametrize("ttft,tpot", [(None, 0.0), (0.0, None), (None, None)])
def test_without_latency_figures_the_pool_alone_still_lowers(ttft: float | None, tpot: float | None) -> None:
    action, reason, message = maxutil(pool_over_target(ttft, tpot), surge=False)
    assert (action, reason) == ("Lower", "KvCachePressure"), message


@pytest.mark.parametrize("ttft,tpot", [(0.10, 0.0), (0.0, 0.30)])
def test_requests_missing_beyond_the_noise_lower(ttft: float, tpot: float) -> None:
    action, reason, message = maxutil(pool_over_target(ttft, tpot), surge=False)
    assert action == "Lower", message


def test_paused_requests_lower_even_when_every_request_was_in_time() -> None:
    action, reason, message = maxutil(pool_over_target(0.0, 0.0, paused=2), surge=False)
    assert (action, reason) == ("Lower", "RequestsPaused"), message
