"""``--log-format json``: each line parses, times are UTC with milliseconds, tracebacks are kept, and a line
logged by an engine's loop names the engine (namespace, name, fingerprint, the tuner's decision)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot import loop as loop_module
from kvpilot.autotune.decision import Decision
from kvpilot.api.status import parse_status, status_dict
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.logjson import JsonFormatter, bind_engine
from tests.unit.helpers import manifest
from tests.unit.virtual_time import VirtualTime


class Lines(logging.Handler):
    """Formats what it receives with the JSON formatter and keeps the parsed objects."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Any:
    handler = Lines()
    log = logging.getLogger("kvpilot.test.logjson")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield handler.lines
    log.removeHandler(handler)


LOG = logging.getLogger("kvpilot.test.logjson")


def test_a_line_has_utc_milliseconds_and_the_message() -> None:
    record = logging.LogRecord("kvpilot.x", logging.WARNING, __file__, 1, "engine %s: %d", ("e1", 3), None)
    record.created = datetime(2026, 11, 29, 12, 0, 5, 123456, tzinfo=timezone.utc).timestamp()
    out = json.loads(JsonFormatter().format(record))
    assert out == {"time": "2026-11-29T12:00:05.123Z", "level": "WARNING", "logger": "kvpilot.x",
                   "message": "engine e1: 3"}
    offset = datetime.fromisoformat(out["time"]).utcoffset()
    assert offset is not None and offset.total_seconds() == 0


def test_tracebacks_and_stacks_are_kept(lines: list[dict[str, Any]]) -> None:
    try:
        raise ValueError("boom in the planner")
    except ValueError:
        LOG.exception("Reconcile crashed")
    LOG.warning("where am I", stack_info=True)
    crashed, stacked = lines
    assert crashed["message"] == "Reconcile crashed"
    assert crashed["exception"].startswith("Traceback (most recent call last):")
    assert crashed["exception"].rstrip().endswith("ValueError: boom in the planner")
    assert "test_tracebacks_and_stacks_are_kept" in stacked["stack"] and "exception" not in stacked


def test_fields_bound_in_a_task_stay_in_that_task(lines: list[dict[str, Any]]) -> None:
    async def engine(name: str, fingerprint: str) -> None:
        bind_engine(namespace="ns", name=name)
        await asyncio.sleep(0)  # the other task binds its own fields meanwhile
        bind_engine(fingerprint=fingerprint, decision="Raise")
        await asyncio.sleep(0)
        LOG.info("planned")
        bind_engine(decision=None)  # removed
        LOG.info("again")

    async def both() -> None:
        await asyncio.gather(engine("a", "fa"), engine("b", "fb"))

    asyncio.run(both())
    LOG.info("outside")  # the tasks' fields did not leak into the caller
    by_name = {(line["name"], line["message"]): line for line in lines if "name" in line}
    assert by_name[("a", "planned")]["fingerprint"] == "fa" and by_name[("b", "planned")]["fingerprint"] == "fb"
    assert by_name[("a", "planned")]["decision"] == "Raise" and "decision" not in by_name[("a", "again")]
    assert by_name[("b", "again")]["namespace"] == "ns"
    assert "name" not in lines[-1] and "namespace" not in lines[-1]


def test_extra_wins_and_kopf_object_lines_name_their_object(lines: list[dict[str, Any]]) -> None:
    async def run() -> None:
        bind_engine(namespace="ns", name="bound")
        LOG.info("explicit", extra={"engine": "e9", "fingerprint": "f9"})

    asyncio.run(run())
    LOG.info("from kopf", extra={"k8s_ref": {"namespace": "team", "name": "e7", "uid": "u"}})
    explicit, kopf_line = lines
    assert (explicit["namespace"], explicit["name"], explicit["fingerprint"]) == ("ns", "e9", "f9")
    assert (kopf_line["namespace"], kopf_line["name"]) == ("team", "e7")
    with pytest.raises(TypeError, match="uid"):
        bind_engine(uid="u1")


def test_a_crash_in_an_engine_loop_logs_the_engine_and_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop binds the engine's fields: its crash report names the engine and the fingerprint it planned."""
    handler = Lines()
    loop_log = logging.getLogger(loop_module.__name__)
    loop_log.addHandler(handler)
    monkeypatch.setattr(loop_log, "propagate", False)
    passes: list[str] = []

    async def reconcile(api: Any, engine: Any, status: dict[str, Any], settings: Any, kv: Any, **_: Any) -> Any:
        passes.append(engine.meta.name)
        if len(passes) > 1:
            raise RuntimeError("a bug in the second pass")
        p = plan(engine, Observed(status=parse_status(status), claim_phase="Bound"), Settings(), datetime.now(timezone.utc))
        p = replace(p, written=status_dict(p.status))  # as reconcile() returns it, having written it
        return replace(p, decision=Decision("Hold", 64, "AtTarget", "the pool is within its target")), Observed()

    monkeypatch.setattr(loop_module, "reconcile", reconcile)
    vt = VirtualTime()
    planned: list[str] = []

    async def run() -> None:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30,  # type: ignore[arg-type]
                                        clock=vt.clock, wait=vt.wait)
        doc = manifest(name="e1", autotune={"enabled": False})
        doc["metadata"].update({"namespace": "team", "uid": "u1", "generation": 1})
        loops.observe("ADDED", doc)
        loop = loops.loops[("team", "e1")]
        await vt.until(lambda: bool(loop.fingerprint), "the first pass")
        planned.append(loop.fingerprint)
        await vt.until(lambda: bool(handler.lines), "the crash report")
        await loops.stop_all()

    try:
        asyncio.run(run())
    finally:
        loop_log.removeHandler(handler)
    crash = handler.lines[0]
    assert crash["level"] == "ERROR" and crash["message"] == "Reconcile of InferenceEngine team/e1 crashed"
    assert (crash["namespace"], crash["name"], crash["fingerprint"]) == ("team", "e1", planned[0])
    assert crash["decision"] == "Hold"  # the tuner's verdict of the last pass
    assert "RuntimeError: a bug in the second pass" in crash["exception"]
