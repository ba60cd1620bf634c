"""The per-engine loop: it sleeps between reconciles (no spin) and keeps the status it wrote."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from kvpilot.api.status import parse_status, status_dict
from kvpilot import loop as loop_module
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.observe.scrape import EngineSampler
from tests.unit.helpers import manifest
from tests.unit.test_reconcile_cache import RecordingApi, claim
from tests.unit.virtual_time import VirtualTime

# A date far from any day the tests run on: a reading of the real date instead of the injected one shows.
FAKE_DATE = datetime(2001, 2, 3, 4, 5, 6, tzinfo=timezone.utc)


def body(**overrides: Any) -> dict[str, Any]:
    doc = manifest(name="e1", **overrides)
    doc["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1})
    return doc


@pytest.fixture
def fake_reconcile(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def reconcile(api: Any, engine: Any, status: dict[str, Any], settings: Any, kv: Any, **_: Any) -> Any:
        calls.append(status)
        p = plan(engine, Observed(status=parse_status(status), claim_phase="Bound"), Settings(), datetime.now(timezone.utc))
        p = replace(p, written=status_dict(p.status))  # as reconcile() returns it, having written it
        pod = PodState("e1-x", ready=True, fingerprint=None, ip="127.0.0.9")
        return p, Observed(pods=(pod,))

    monkeypatch.setattr(loop_module, "reconcile", reconcile)
    return calls


def _loops(vt: VirtualTime) -> loop_module.EngineLoops:
    return loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30,  # type: ignore[arg-type]
                                   clock=vt.clock, wait=vt.wait)


def test_the_loop_sleeps_until_the_next_reconcile_when_not_sampling(fake_reconcile: list, monkeypatch) -> None:
    """100 virtual seconds of an engine that is not sampling: one wait per reconcile, each as long as the plan
    asks (15 s while it is Progressing), never the 50 ms floor of a loop that spins."""
    parses = []
    original = loop_module.EngineLoop.engine
    monkeypatch.setattr(loop_module.EngineLoop, "engine", lambda self: parses.append(1) or original(self))
    vt = VirtualTime()

    async def run() -> None:
        loops = _loops(vt)
        loops.observe("ADDED", body(autotune={"enabled": False}))
        await vt.run_until(100)
        await loops.stop_all()

    asyncio.run(run())
    assert vt.waits and min(vt.waits) >= 14.9, vt.waits  # a spinning loop waits 0.05 s, ~2,000 times
    # A reconcile at 0, 15, 30 ... s and one wait after each: the clock stops on the first 15 s step past 100.
    assert vt.now == 105 and len(fake_reconcile) == len(vt.waits) == 8
    assert len(parses) <= 2 * len(fake_reconcile)  # the body is parsed at the pass, not between passes


def test_a_late_watch_event_does_not_roll_back_the_written_status(fake_reconcile: list) -> None:
    vt = VirtualTime()

    async def run() -> loop_module.EngineLoop:
        loops = _loops(vt)
        loops.observe("ADDED", body(autotune={"enabled": False}))
        loop = loops.loops[("ns", "e1")]
        await vt.until(lambda: loop.wrote_status, "the first reconcile writing status")
        stale = body(autotune={"enabled": False})
        stale["status"] = {"batching": {"maxBatchSize": 999}}
        loops.observe("MODIFIED", stale)
        await loops.stop_all()
        return loop

    loop = asyncio.run(run())
    assert loop.body["status"]["batching"]["maxBatchSize"] == 64


def _fake_wall(vt: VirtualTime) -> float:
    """The fake date, advancing with the virtual clock."""
    return FAKE_DATE.timestamp() + vt.now


def test_a_reconcile_dates_the_status_by_the_injected_wall_clock() -> None:
    """The real loop and reconcile (fake API wire): the conditions it writes carry the injected date, not the
    machine's (the loop used to leave ``now`` to reconcile, which read ``datetime.now``)."""
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    vt = VirtualTime()
    vt.now = 42.0

    async def run() -> loop_module.EngineLoop:
        loops = loop_module.EngineLoops(api=api, settings=Settings(), resync_seconds=30, clock=vt.clock,
                                        wait=vt.wait, wall_clock=lambda: _fake_wall(vt))
        loops.observe("ADDED", body(autotune={"enabled": False}))
        loop = loops.loops[("ns", "e1")]
        await vt.until(lambda: loop.wrote_status, "the first reconcile writing status")
        await loops.stop_all()
        return loop

    asyncio.run(run())
    conditions = api.status_patches[0]["conditions"]
    assert conditions and {c["lastTransitionTime"] for c in conditions} == {"2001-02-03T04:05:48Z"}


def test_pod_warmup_and_sample_times_follow_the_injected_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod that started at the fake date with a 60 s warmup is first scraped 60 virtual seconds later, and
    the sample is timed on the fake date. Read on the machine's date the pod is decades old: scraped at once."""
    scraped: list[tuple[float, float]] = []  # (virtual time, sample wall time)
    reconciled_at: list[tuple[float, datetime | None]] = []  # (virtual time, the now it was given)
    vt = VirtualTime()

    async def fake_reconcile(api: Any, engine: Any, status: dict[str, Any], settings: Any, kv: Any,
                             now: datetime | None = None, **_: Any) -> Any:
        reconciled_at.append((vt.now, now))
        at = now or datetime.now(timezone.utc)  # as reconcile() does
        p = plan(engine, Observed(status=parse_status(status), claim_phase="Bound"), Settings(), at)
        p = replace(p, written=status_dict(p.status))
        pod = PodState("e1-x", ready=True, fingerprint=None, ip="127.0.0.9", started_at="2001-02-03T04:05:06Z")
        return p, Observed(pods=(pod,))

    async def fake_scrape(self: EngineSampler, session: Any, pod: PodState, port: int, wall: float,
                          *_: Any) -> None:
        scraped.append((vt.now, wall))

    monkeypatch.setattr(loop_module, "reconcile", fake_reconcile)
    monkeypatch.setattr(EngineSampler, "_scrape", fake_scrape)

    async def run() -> None:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30,  # type: ignore[arg-type]
                                        clock=vt.clock, wait=vt.wait, wall_clock=lambda: _fake_wall(vt))
        loops.observe("ADDED", body(autotune={"enabled": True, "intervalSeconds": 30, "warmupSeconds": 60}))
        await vt.run_until(120)
        await loops.stop_all()

    asyncio.run(run())
    assert scraped, "the pod was never scraped"
    first_at, first_wall = scraped[0]
    assert 60 <= first_at < 70  # warm from 60 s on; samples are due every 5 s
    for at, wall in scraped:
        assert wall == pytest.approx(FAKE_DATE.timestamp() + at)
    assert reconciled_at and all(now == FAKE_DATE + timedelta(seconds=at) for at, now in reconciled_at)


def test_the_flags_the_memo_and_the_classes_share_one_set_of_defaults() -> None:
    """``kvpilot run``, the kopf memo (a test or an embedding starts the operator through it) and the classes
    used to default to different sizes (32 and 16): each default is now one constant."""
    import inspect

    from kvpilot import defaults
    from kvpilot.cli import build_parser
    from kvpilot.handlers.engine import memo_for
    from kvpilot.k8s.api import Api

    args = build_parser().parse_args(["run"])
    memo = memo_for(Settings(), 30.0)
    loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30)  # type: ignore[arg-type]
    assert args.concurrent_reconciles == memo.concurrent_reconciles == loops.slots.size == defaults.CONCURRENT_RECONCILES
    assert args.api_pool_size == memo.api_pool_size == defaults.API_POOL_SIZE
    assert inspect.signature(Api).parameters["pool_size"].default == defaults.API_POOL_SIZE
