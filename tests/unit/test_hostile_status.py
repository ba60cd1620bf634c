"""A hand-edited status (the status subresource is user-writable) goes through the operator's loop, the scrape
facts, engine parsing and a real reconcile pass without raising: what does not fit reads as absent, and the
next write replaces it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot import loop as loop_module
from kvpilot.api.status import BatchingStatus, EngineInfo, EngineStatus, parse_status
from kvpilot.desired.settings import Settings
from kvpilot.observe.scrape import EngineFacts
from kvpilot.reconcile import reconcile
from tests.unit.helpers import manifest
from tests.unit.test_reconcile_cache import RecordingApi, claim
from tests.unit.virtual_time import VirtualTime

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)

# Every section the operator reads, with a value of the wrong shape (a list, a string, a number, null).
SECTIONS: dict[str, object] = {
    "engine": "not-a-record", "batching": [64], "build": 7, "autotune": "x", "kvCache": [],
    "conditions": "True", "observedGeneration": "1", "replicas": {"n": 1},
}
HOSTILE: list[object] = [
    SECTIONS,
    {"engine": {"tokensPerBlock": "32", "maxBatchSize": [64]}, "batching": {"maxBatchSize": "64"},
     "conditions": [7, {"type": 5}, {"type": "Ready"}], "autotune": {"history": "none"}},
    "a string", [1, 2], 42,
]


def body(status: object) -> dict[str, Any]:
    doc = manifest(name="e1", autotune={"enabled": True, "intervalSeconds": 6, "warmupSeconds": 0})
    doc["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1})
    return {**doc, "status": status}


@pytest.mark.parametrize("status", HOSTILE, ids=range(len(HOSTILE)))
def test_the_loop_and_the_scrape_facts_read_a_hostile_status_as_absent(status: object) -> None:
    loop = loop_module.EngineLoop(key=("ns", "e1"), body=body(status))
    typed = loop.status()
    assert isinstance(typed, EngineStatus)
    assert (typed.engine or EngineInfo()) == EngineInfo() and (typed.batching or BatchingStatus()) == BatchingStatus()
    assert not typed.conditions  # none is a well-formed record
    assert typed.observed_generation is None  # "1" is no integer: the engine is held to every CEL rule
    assert loop.engine().meta.name == "e1"
    assert EngineFacts.from_status(typed) == EngineFacts()  # nothing known: no sample is judged by junk
    assert loop.status() is typed  # parsed once per stored version


@pytest.mark.parametrize("status", [s for s in HOSTILE if isinstance(s, dict)], ids=["wrong-types", "bad-fields"])
def test_a_reconcile_over_a_hostile_status_replaces_it(status: dict[str, Any]) -> None:
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    e = loop_module.EngineLoop(key=("ns", "e1"), body=body(status)).engine()
    p, observed = asyncio.run(reconcile(api, e, status, Settings(), None, NOW, writer=api.writer))
    assert observed.status == parse_status(status)
    assert p.written is not None and parse_status(p.written) == p.status
    (patch,) = api.status_patches
    for key, value in status.items():  # every hostile value is overwritten by the plan's, or removed (null)
        assert key in patch and patch[key] != value, key
    assert isinstance(patch["batching"], dict) and isinstance(patch["batching"]["maxBatchSize"], int)


@pytest.mark.parametrize("status", HOSTILE, ids=range(len(HOSTILE)))
def test_the_operator_loop_runs_over_a_hostile_stored_status(status: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real per-engine loop and reconcile (fake API wire): the first pass plans, writes a well-formed
    status and keeps it as the stored one; no pass crashes."""
    api = RecordingApi()
    api.cache.upsert("PersistentVolumeClaim", claim("claim-1"))
    vt = VirtualTime()
    crashes: list[str] = []

    async def run() -> loop_module.EngineLoop:
        loops = loop_module.EngineLoops(api=api, settings=Settings(), resync_seconds=30, clock=vt.clock,
                                        wait=vt.wait)
        loops.observe("ADDED", body(status))
        loop = loops.loops[("ns", "e1")]
        await vt.until(lambda: loop.wrote_status, "the first reconcile writing status")
        await loops.stop_all()
        return loop

    monkeypatch.setattr(loop_module.log, "exception", lambda msg, *args, **_: crashes.append(msg % args))
    loop = asyncio.run(run())
    assert crashes == []
    assert api.status_patches and isinstance(loop.body["status"], dict)
    assert loop.status().batching is not None and loop.status().batching.max_batch_size is not None
