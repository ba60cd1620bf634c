"""A lower for the KV pool (paused requests, a MaxUtilization pool over target) is made once the misses it may fix
pay for its restart, as for a TPOT break (rules._pool_lower).

Measured on the suite's KV-scarce L4 under MaxUtilization without a spare GPU: every static limit serves that
traffic within 1%, and from TensorRT-LLM's default each lower the pool called for cost its restart (2048 -> 8 on a
92% peak: 0.403 req/s where 2048 held serves 0.415). Where objectives are set the misses decide; without
objectives, or on pods that export no latency, the pool's signal decides as before.
"""

from __future__ import annotations

from dataclasses import replace

from kvpilot.api.models import AutotuneSpec
from kvpilot.autotune.constants import MIN_WINDOW_REQUESTS
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import ChangeCost
from kvpilot.autotune.policy import decide
from kvpilot.autotune.verification import Baseline, Memory
from kvpilot.autotune.verify import WindowFigures
from kvpilot.autotune.window import KvWindow
from tests.unit.test_autotune_mild_break import settled
from tests.unit.test_autotune_rollback import NOW, SPEC, inp, kv


def pool(util: float = 0.92, paused: int = 0, misses: float | None = 0.0, finished_per_pod_s: float = 1.0) -> KvWindow:
    """Two pods running 512 requests under a limit of 512, the pool ``util`` full; ``misses`` of the window's
    requests missed TTFT (None: the pods export no latency), ``finished_per_pod_s`` finished per pod and second."""
    return replace(kv(active=512, tpot=40.0), peak_utilization=util, paused=paused, ttft_miss_fraction=misses,
                   tpot_miss_fraction=None if misses is None else 0.0, completion_rate=finished_per_pod_s)


def decide_max_util(w: KvWindow, spec: AutotuneSpec = SPEC, mem: Memory | None = None) -> Decision:
    """The tuner's decision under MaxUtilization, two pods and no spare GPU (each restart takes one away)."""
    return decide(replace(inp(w=w, mem=mem), spec=spec, scheduler_policy="MaxUtilization",
                          cost=ChangeCost(replicas=2, restart_seconds=90.0, surge=False)))


def test_a_pool_over_target_that_costs_no_request_its_objectives_is_held() -> None:
    d = decide_max_util(pool(util=0.92, misses=0.0))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "KV 92% peak" in d.message and "misses fixed 0s" in d.message


def test_paused_requests_that_miss_nothing_are_held_too() -> None:
    d = decide_max_util(pool(util=1.0, paused=2, misses=0.0))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert d.message.startswith("2 requests were paused")


def test_a_pool_whose_misses_pay_for_the_restart_is_lowered() -> None:
    for paused, reason in ((0, "KvCachePressure"), (3, "RequestsPaused")):
        d = decide_max_util(pool(util=1.0, paused=paused, misses=0.6))
        assert (d.action, d.reason) == ("Lower", reason), d.message
        assert d.target < 512 and "60% of requests miss" in d.message


def test_a_window_of_a_handful_of_requests_waits_for_settled_evidence() -> None:
    """At 0.4 req/s a 15 s window finishes about six requests; one that missed them all is no evidence."""
    few = (MIN_WINDOW_REQUESTS - 1) / (2 * 15.0)  # per pod and second: one request short of the bar
    for paused in (0, 1):
        d = decide_max_util(pool(util=0.95, paused=paused, misses=1.0, finished_per_pod_s=few))
        assert (d.action, d.reason) == ("Hold", "KvPressureUnconfirmed"), d.message
        assert "9 requests finished in this window, too few" in d.message
    # nothing finished at all: the same wait
    d = decide_max_util(pool(util=0.95, misses=None, finished_per_pod_s=0.0))
    assert (d.action, d.reason) == ("Hold", "KvPressureUnconfirmed"), d.message


def test_a_small_window_is_weighed_on_the_settled_minutes() -> None:
    few = 3 / (2 * 15.0)
    calm = decide_max_util(pool(util=0.95, misses=1.0, finished_per_pod_s=few), mem=settled(0.97))
    assert (calm.action, calm.reason) == ("Hold", "NotWorthARestart"), calm.message
    assert "3 requests finished in this window, 3.0% missed over the last" in calm.message
    missing = decide_max_util(pool(util=0.95, misses=1.0, finished_per_pod_s=few), mem=settled(0.3))
    assert (missing.action, missing.reason) == ("Lower", "KvCachePressure"), missing.message


def test_without_objectives_or_latency_the_pool_decides_as_before() -> None:
    no_slo = decide_max_util(pool(util=0.99, misses=0.0), spec=replace(SPEC, slo=None))
    assert (no_slo.action, no_slo.reason) == ("Lower", "KvCachePressure"), no_slo.message
    blind = decide_max_util(pool(util=0.99, misses=None, finished_per_pod_s=1.0))
    assert (blind.action, blind.reason) == ("Lower", "KvCachePressure"), blind.message


def test_guaranteed_no_evict_never_lowers_for_a_full_pool() -> None:
    d = decide(inp(w=pool(util=0.99, misses=0.0)))
    assert d.reason != "KvCachePressure", d.message


def sparse(share: float, per_window: float, windows: int = 8) -> Memory:
    """Verification's baseline at 512: ``windows`` clean 15 s windows ending now, each resolving ``per_window``
    requests (the fleet's), ``share`` of them in time."""
    base = Baseline()
    start = NOW.timestamp() - 15.0 * windows
    for k in range(windows):
        w = WindowFigures(start + 15.0 * (k + 1), 15.0, 512, 2, 2, per_window, per_window, per_window * share,
                          per_window, 400.0, 10.0, 6000.0, 400.0)
        base = base.observe(w, 512)
    return Memory(baseline=base)


def test_at_a_very_low_rate_the_settled_minutes_need_only_what_they_can_hold() -> None:
    """Below about 0.16 req/s the pool (faded past four minutes) never holds 40 requests: a wait for them would
    never end. At 0.1 req/s, 135 s of settled windows (13.5 requests) are enough: two minutes of that traffic."""
    few = 1 / (2 * 15.0)  # one request finished in this window
    slow = sparse(0.4, per_window=1.5, windows=12)  # 0.1 req/s, 40% in time
    assert 12 <= slow.baseline.side.resolved < 40
    d = decide_max_util(pool(util=1.0, paused=1, misses=1.0, finished_per_pod_s=few), mem=slow)
    assert (d.action, d.reason) == ("Lower", "RequestsPaused"), d.message
    assert "60.0% missed over the last" in d.message
    # At 0.4 req/s the bar is 40 requests: 30 resolved over 75 s are not yet enough.
    quicker = sparse(0.4, per_window=6.0, windows=8)
    assert quicker.baseline.side.seconds >= 60 and quicker.baseline.side.resolved < 40
    d = decide_max_util(pool(util=1.0, paused=1, misses=1.0, finished_per_pod_s=few), mem=quicker)
    assert (d.action, d.reason) == ("Hold", "KvPressureUnconfirmed"), d.message


def test_paused_requests_while_nothing_finishes_and_requests_queue_are_lowered() -> None:
    """A stall: without a finished request there is no share to weigh, and waiting would not end it."""
    stalled = replace(pool(util=1.0, paused=3, misses=None, finished_per_pod_s=0.0), mean_queued=4.0)
    d = decide_max_util(stalled)
    assert (d.action, d.reason) == ("Lower", "RequestsPaused"), d.message
    assert "nothing finished while requests queued" in d.message
    # Without a queue, nothing finishing in 15 s is long requests, not a stall: the tuner waits.
    d = decide_max_util(replace(stalled, mean_queued=0.0))
    assert (d.action, d.reason) == ("Hold", "KvPressureUnconfirmed"), d.message


def test_the_restart_is_priced_as_for_a_tpot_lower() -> None:
    """Half the misses fixed over the 1,800 s horizon against twice the restart: two pods of 90 s without surge,
    at full load, cost 198 s of traffic, so 44% missing pays and 30% does not."""
    d = decide_max_util(pool(util=1.0, misses=0.30))
    assert (d.action, d.reason) == ("Hold", "NotWorthARestart"), d.message
    assert "misses fixed 270s vs restart 198s" in d.message
    d = decide_max_util(pool(util=1.0, misses=0.45))
    assert (d.action, d.reason) == ("Lower", "KvCachePressure"), d.message
    assert "misses fixed 405s vs restart 198s" in d.message
