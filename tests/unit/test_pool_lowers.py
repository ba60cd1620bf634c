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
from kvpilot.autotune.verification import Memory
from kvpilot.autotune.window import KvWindow
from tests.unit.test_autotune_mild_break import settled
from tests.unit.test_autotune_rollback import SPEC, inp, kv

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
        assert (d.action, d.reason) == ("Hold", "InsufficientData"), d.message
        assert "9 requests finished in this window, too few" in d.message
    # nothing finished at all: the same wait
    d = decide_max_util(pool(util=0.95, misses=None, finished_per_pod_s=0.0))
    assert (d.action, d.reason) == ("Hold", "InsufficientData"), d.message


def test_a_small_window_is_weighed_on_the_settled_minutes() -> None:
    few = 3 / (2 * 15.0)
    calm = decide_max_util(pool(util=0.95, misses=1.0, finished_per_pod_s=few), mem=settled(0.97))
    assert (calm.action, calm.reason) == ("Hold", "NotWorthARestart"), calm.message
    assert "3 requests finished in this window, 3.0% missed over the last" in calm.message
    lasting = decide_max_util(pool(util=0.95, misses=1.0, finished_per_pod_s=few), mem=settled(0.3))
    assert (lasting.action, lasting.reason) == ("Lower", "KvCachePressure"), lasting.message


def test_without_objectives_or_latency_the_pool_decides_as_before() -> None:
    no_slo = decide_max_util(pool(util=0.99, misses=0.0), spec=replace(SPEC, slo=None))
    assert (no_slo.action, no_slo.reason) == ("Lower", "KvCachePressure"), no_slo.message
    blind = decide_max_util(pool(util=0.99, misses=None, finished_per_pod_s=1.0))
    assert (blind.action, blind.reason) == ("Lower", "KvCachePressure"), blind.message


def test_guaranteed_no_evict_never_lowers_for_a_full_pool() -> None:
    d = decide(inp(w=pool(util=0.99, misses=0.0)))
    assert d.reason != "KvCachePressure", d.message
