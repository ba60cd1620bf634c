"""The per-engine loop: it sleeps between reconciles (no spin) and keeps the status it wrote."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot import loop as loop_module
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.plan import Settings, plan
from tests.unit.helpers import manifest


def body(**overrides: Any) -> dict[str, Any]:
    doc = manifest(name="e1", **overrides)
    doc["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1})
    return doc


@pytest.fixture
def fake_reconcile(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def reconcile(api: Any, engine: Any, status: dict[str, Any], settings: Any, kv: Any, **_: Any) -> Any:
        calls.append(status)
        p = plan(engine, Observed(status=status, claim_phase="Bound"), Settings(), datetime.now(timezone.utc))
        pod = PodState("e1-x", ready=True, fingerprint=None, ip="127.0.0.9")
        return p, Observed(pods=(pod,))

    monkeypatch.setattr(loop_module, "reconcile", reconcile)
    return calls


def test_the_loop_sleeps_until_the_next_reconcile_when_not_sampling(fake_reconcile: list, monkeypatch) -> None:
    parses = []
    original = loop_module.EngineLoop.engine
    monkeypatch.setattr(loop_module.EngineLoop, "engine", lambda self: parses.append(1) or original(self))

    async def run() -> None:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30)  # type: ignore[arg-type]
        loops.observe("ADDED", body(autotune={"enabled": False}))
        await asyncio.sleep(1.0)
        await loops.stop_all()

    asyncio.run(run())
    assert len(fake_reconcile) == 1
    assert len(parses) <= 3  # a spinning loop would have woken about twenty times


def test_a_late_watch_event_does_not_roll_back_the_written_status(fake_reconcile: list) -> None:
    async def run() -> loop_module.EngineLoop:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30)  # type: ignore[arg-type]
        loops.observe("ADDED", body(autotune={"enabled": False}))
        await asyncio.sleep(0.3)
        stale = body(autotune={"enabled": False})
        stale["status"] = {"batching": {"maxBatchSize": 999}}
        loops.observe("MODIFIED", stale)
        loop = loops.loops[("ns", "e1")]
        await loops.stop_all()
        return loop

    loop = asyncio.run(run())
    assert loop.body["status"]["batching"]["maxBatchSize"] == 64
