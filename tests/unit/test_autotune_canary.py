"""The canary's pure parts (autotune/canary.py): which decisions get one, how many pods each Deployment runs at
each step, the verdict (a canary that cannot be judged is rolled back, unlike a change in force), and the
sampler's windows of the canary pod and of the others (observe/scrape.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvpilot.autotune import canary as C
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.verify import GIVE_UP_SECONDS, Outcome, WindowFigures, Why
from kvpilot.desired.observed import PodState
from kvpilot.observe.scrape import EngineFacts, EngineSampler
from kvpilot.observe.signals import MetricsSource
from tests.fuzz.make_metrics_corpus import GOOD
from tests.unit.helpers import engine

RAISE = Decision("Raise", 512, "QueueWithHeadroom", "requests queue")


@pytest.mark.parametrize("decision, replicas, multinode, enabled, wanted", [
    (RAISE, 2, False, True, True),
    (Decision("Lower", 32, "ReservationBound", "free the slots"), 4, False, True, True),
    (RAISE, 1, False, True, False),  # nothing to compare it with
    (RAISE, 2, True, True, False),  # a LeaderWorkerSet: verified after the change instead
    (RAISE, 2, False, False, False),  # autotune.canary: Off
    (Decision("Lower", 32, "TpotObjectiveBroken", "p95 TPOT over"), 2, False, True, False),
    (Decision("Lower", 32, "KvCachePressure", "pool full"), 2, False, True, False),
    (Decision("Lower", 32, "RequestsPaused", "paused"), 2, False, True, False),
    (Decision("Lower", 64, "RolledBack", "serves worse"), 2, False, True, False),
    (Decision("Raise", 16, "OutOfBounds", "below minBatchSize"), 2, False, True, False),
    (Decision("Hold", 64, "NoPressure", "fine"), 2, False, True, False),
    (None, 2, False, True, False),
])
def test_which_decisions_are_tried_on_one_pod_first(decision: Decision | None, replicas: int, multinode: bool,
                                                    enabled: bool, wanted: bool) -> None:
    assert C.wants_canary(decision, replicas, multinode, enabled) is wanted


def test_pods_of_each_deployment_at_each_step() -> None:
    without = C.start(RAISE, 64, 100.0, spare=False)
    assert (C.old_pods(without, 4), C.canary_pods(without, False)) == (3, 1)  # the first replaced pod
    spare = C.start(RAISE, 64, 100.0, spare=True)
    assert (C.old_pods(spare, 4), C.canary_pods(spare, False)) == (4, 1)  # beside every old pod until Ready
    ready = spare.became_ready(True, 130.0)
    assert ready.ready_at_s == 130.0 and C.old_pods(ready, 4) == 3
    assert ready.became_ready(False, 160.0).ready_at_s == 130.0  # a readiness flap scales nothing back up
    assert C.old_pods(ready.promoted(), 4) == 4
    assert C.canary_pods(ready.promoted(), True) == 1 and C.canary_pods(ready.promoted(), False) == 0
    assert C.canary_pods(without.promoted(), True) == 0  # its GPU is the one the fourth old pod needs
    assert (C.old_pods(None, 4), C.canary_pods(None, True)) == (4, 0)


def figures(end_s: float, limit: int, share: float, pods: int = 1) -> WindowFigures:
    return WindowFigures(end_s, 15.0, limit, pods, pods, 450 * pods, 450 * pods, 450 * pods * share, 450 * pods,
                         batch=min(limit, 60), latency_s=5.0, prompt_mean=150, output_mean=600)


def test_a_canary_is_rolled_back_on_a_clear_drop_and_a_window_seen_twice_counts_once() -> None:
    c = C.start(RAISE, 64, 0.0, spare=False)
    for k in range(1, 7):
        w = figures(15.0 * k, 512, 0.2)
        c = c.observe(w, figures(15.0 * k, 64, 0.9), "pods")
        assert c.observe(w, figures(15.0 * k, 64, 0.9), "pods") == c  # the same window again: nothing new
    # The first window starts the settling; evidence counts one request's life after the batch stopped growing.
    assert c.judged.canary.seconds == 45.0
    verdict = c.verdict(90.0)
    assert verdict.outcome == Outcome.ROLL_BACK and verdict.why == Why.WORSE


def test_a_window_whose_pods_changed_is_no_evidence() -> None:
    c = C.start(RAISE, 64, 0.0, spare=False).observe(figures(15.0, 512, 0.2), figures(15.0, 64, 0.9), "a")
    before = c.judged
    c = c.observe(figures(30.0, 512, 0.2), figures(30.0, 64, 0.9), "b")  # a pod restarted or came
    assert c.judged.canary == before.canary and c.judged.others == before.others


def test_a_canary_without_a_verdict_is_rolled_back_at_the_give_up_time_after_its_pod_was_ready() -> None:
    c = C.start(RAISE, 64, 0.0, spare=False)
    assert c.verdict(2 * GIVE_UP_SECONDS).outcome == Outcome.UNDECIDED  # never Ready: canary_checks' to judge
    ready = c.became_ready(True, 100.0)
    assert ready.verdict(100.0 + GIVE_UP_SECONDS - 1).outcome == Outcome.UNDECIDED
    late = ready.verdict(100.0 + GIVE_UP_SECONDS)
    assert late.outcome == Outcome.ROLL_BACK and late.why == Why.GAVE_UP and "cannot be judged" in late.message


def test_the_sampler_gives_each_group_its_own_window() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    busy = dict(GOOD, kvCacheStats={"usedNumBlocks": 80, "maxNumBlocks": 100, "tokensPerBlock": 32})
    sampler.accept("canary", clock[0], json.dumps([busy]).encode(), None, EngineFacts())
    sampler.accept("old-0", clock[0], json.dumps([GOOD]).encode(), None, EngineFacts())
    sampler.accept("old-1", clock[0], json.dumps([GOOD]).encode(), None, EngineFacts())
    clock[0] += 1
    canary, others, whole = sampler.window(30, only={"canary"}), sampler.window(30, only={"old-0", "old-1"}), \
        sampler.window(30)
    assert canary is not None and canary.pods == 1 and canary.peak_utilization == pytest.approx(0.8)
    assert others is not None and others.pods == 2 and others.peak_utilization == pytest.approx(0.1)
    assert whole is not None and whole.pods == 3


def test_the_metrics_source_splits_the_canary_from_the_others() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    for pod in ("c", "o"):
        sampler.accept(pod, clock[0], json.dumps([GOOD]).encode(), None, EngineFacts())
    clock[0] += 1
    pods = [PodState("c", True, None, ip="10.0.0.1", canary=True), PodState("o", True, None, ip="10.0.0.2")]
    e = engine(autotune={"mode": "Auto"})

    async def windows() -> tuple[object, object]:
        source = MetricsSource(wall_clock=lambda: clock[0])
        try:
            return await source.canary_windows(sampler, e, pods)
        finally:
            await source.close()

    canary, others = asyncio.run(windows())
    assert getattr(canary, "pods") == 1 and getattr(others, "pods") == 1
    assert asyncio.run(MetricsSource().canary_windows(sampler, e, pods[1:])) == (None, None)  # no canary pod


def test_a_clear_gain_is_promoted_on_a_minute_of_evidence_and_no_loss_on_two() -> None:
    """Every interval a canary is judged holds the other pods at the old value: a gain beyond the noise bound is
    promoted as soon as a loss would be rolled back (a minute of settled evidence); a canary that serves the same
    waits the two minutes a change in force is verified on."""
    def after(share: float, windows: int) -> C.Canary:
        c = C.start(RAISE, 64, 0.0, spare=False)
        for k in range(1, windows + 1):
            c = c.observe(figures(15.0 * k, 512, share), figures(15.0 * k, 64, 0.6), "pods")
        return c

    assert after(0.9, 6).judged.canary.seconds == 45.0 and after(0.9, 6).verdict(90.0).outcome == Outcome.UNDECIDED
    gain = after(0.9, 7).verdict(105.0)
    assert gain.outcome == Outcome.KEEP and gain.why == Why.BETTER
    assert after(0.6, 7).verdict(105.0).outcome == Outcome.UNDECIDED
    same = after(0.6, 11).verdict(165.0)
    assert same.outcome == Outcome.KEEP and same.why == Why.NO_WORSE


def test_the_prometheus_source_queries_the_canary_and_the_others_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``metrics.source: Prometheus`` the canary's window and the others' are one query each, over the warm
    pods of each group (the server still has the pods' older samples)."""
    from kvpilot.observe import signals

    asked: list[set[str]] = []

    async def query(_session: object, _url: str, _ns: str, _name: str, _interval: int, live: set[str],
                    *_a: object, **_k: object) -> str:
        asked.append(set(live))
        return f"window of {sorted(live)}"

    monkeypatch.setattr(signals, "query_prometheus", query)
    e = engine(autotune={"mode": "Auto", "warmupSeconds": 0,
                         "metrics": {"source": "Prometheus", "url": "http://prometheus.monitoring.svc:9090"}})
    pods = [PodState("c", True, None, ip="10.0.0.1", canary=True), PodState("o1", True, None, ip="10.0.0.2"),
            PodState("o2", False, None, ip="10.0.0.3")]  # not Ready: not warm, left out

    async def windows() -> tuple[object, object]:
        source = MetricsSource(wall_clock=lambda: 1000.0)
        try:
            return await source.canary_windows(EngineSampler(), e, pods)
        finally:
            await source.close()

    assert asyncio.run(windows()) == ("window of ['c']", "window of ['o1']")
    assert asked == [{"c"}, {"o1"}]
