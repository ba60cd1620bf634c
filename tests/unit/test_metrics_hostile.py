"""Metrics are untrusted input (issue 13): the committed corpus of hostile replies goes through the scrape,
parse and sample path with an injected clock — 0 tracebacks, every payload rejected and counted, the reason in
the condition — and a failing sample can never make the engine's loop spin."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from kvpilot.api.status import parse_status, status_dict
from kvpilot import loop as loop_module
from kvpilot import telemetry
from kvpilot.desired.contract import metrics_condition
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.observe.prometheus import parse_matrix
from kvpilot.observe.replies import decode_json
from kvpilot.observe.scrape import EngineFacts, EngineSampler
from kvpilot.observe.signals import MetricsSource
from kvpilot.trtllm.metrics import MetricsRejected
from tests.fuzz.make_metrics_corpus import GOOD, load
from tests.unit.helpers import manifest
from tests.unit.virtual_time import VirtualTime

CORPUS = load()
POD = PodState("e1-x", ready=True, fingerprint=None, ip="127.0.0.9")
FACTS = EngineFacts(tokens_per_block=32, max_batch_size_ceiling=64)


class FakeResponse:
    """Delivers its body in small pieces, as a socket does (a reader must loop until EOF)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.content = self

    async def read(self, n: int) -> bytes:
        piece, self.body = self.body[: min(n, 1000)], self.body[min(n, 1000):]
        return piece

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


class FakeSession:
    """Serves fixed replies per path and counts the requests."""

    def __init__(self, replies: dict[str, tuple[int, bytes]]) -> None:
        self.replies, self.calls = replies, 0  # calls: /metrics reads, one per scrape of a pod

    def get(self, url: str, **_: Any) -> FakeResponse:
        path = "/" + url.split("/", 3)[3]
        self.calls += path == "/metrics"
        status, body = self.replies.get(path, (404, b"Not Found"))
        return FakeResponse(status, body)


def rejected_total() -> float:
    return sum(s.value for m in telemetry.METRICS_REJECTED.collect() for s in m.samples if s.name.endswith("_total"))


def test_the_corpus_has_at_least_100_payloads() -> None:
    assert len(CORPUS) >= 100 and {e["kind"] for e in CORPUS} == {"stats", "prometheus", "matrix"}


@pytest.mark.parametrize("entry", [e for e in CORPUS if e["kind"] != "matrix"], ids=lambda e: str(e["note"])[:60])
def test_each_hostile_reply_is_a_counted_rejection_never_an_exception(entry: dict[str, Any]) -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    body = entry["bytes"]
    replies = {"/metrics": (200, body)} if entry["kind"] == "stats" else \
        {"/metrics": (200, b"[]"), "/prometheus/metrics": (200, body)}
    session = FakeSession(replies)
    before = rejected_total()
    asyncio.run(sampler.tick(session, [POD], port=8000, now=datetime.now(timezone.utc),  # type: ignore[arg-type]
                             warmup_seconds=0, want_latency=True, facts=FACTS))
    assert rejected_total() == before + 1, entry["note"]
    assert not any(r.samples or r.latency for r in sampler.pods.values())
    clock[0] += 1
    window = sampler.window(30)
    assert window is not None and window.samples == 0 and window.rejected_samples == 1
    cond = metrics_condition(window)
    assert cond is not None and cond.status == "False" and cond.reason == "SamplesRejected"
    assert "Pod e1-x" in cond.message


@pytest.mark.parametrize("entry", [e for e in CORPUS if e["kind"] == "matrix"], ids=lambda e: str(e["note"])[:60])
def test_each_hostile_prometheus_answer_is_rejected_naming_what_is_wrong(entry: dict[str, Any]) -> None:
    with pytest.raises(MetricsRejected) as err:
        parse_matrix(decode_json(entry["bytes"]))
    assert err.value.reason and str(err.value)


def test_a_large_reply_arriving_in_pieces_is_read_whole() -> None:
    import json

    body = json.dumps([GOOD] * 500).encode()  # ~130 kB, as a busy engine drains
    sampler = EngineSampler(clock=lambda: 1000.0)
    session = FakeSession({"/metrics": (200, body)})
    asyncio.run(sampler.tick(session, [POD], port=8000, now=datetime.now(timezone.utc),  # type: ignore[arg-type]
                             warmup_seconds=0, want_latency=False, facts=FACTS))
    assert len(sampler.pods["e1-x"].samples) == 500 and not sampler.rejections


def test_a_rejected_sample_does_not_poison_the_window_and_good_samples_still_count() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    import json

    good = json.dumps([GOOD]).encode()
    assert sampler.accept("a", clock[0], good, None, FACTS) == 1
    assert sampler.accept("b", clock[0], b'[{"kvCacheStats": 1}]', None, FACTS) == 0
    foreign = json.dumps([{**GOOD, "kvCacheStats": {"usedNumBlocks": 900, "maxNumBlocks": 100}}]).encode()
    assert sampler.accept("c", clock[0], foreign, None, FACTS) == 0  # a utilization of 9.0 is not taken
    clock[0] += 1
    w = sampler.window(30)
    assert w is not None and w.samples == 1 and w.peak_utilization == pytest.approx(0.1)
    assert w.rejected_samples == 2 and "usedNumBlocks 900 > maxNumBlocks 100" in (w.rejection or "")
    clock[0] += 60  # the rejections age out of the window with the samples
    assert sampler.window(30) is None


def test_samples_of_another_engine_are_ignored() -> None:
    from kvpilot.trtllm.metrics import parse_iteration_stats

    (s,) = parse_iteration_stats([GOOD], 0)
    assert FACTS.inconsistency(s) is None
    assert EngineFacts(tokens_per_block=64).inconsistency(s) == "tokensPerBlock 32 is not the engine's 64"
    assert "maxBatchSizeStatic 64 is above the engine's max_batch_size 16" in (
        EngineFacts(max_batch_size_ceiling=16).inconsistency(s) or "")
    assert EngineFacts(max_batch_size_ceiling=512).inconsistency(s) is None  # a runtime limit below the ceiling
    (torch,) = parse_iteration_stats([{**GOOD, "maxBatchSizeStatic": 0}], 0)  # PyTorch never sets it
    assert EngineFacts(max_batch_size_ceiling=16).inconsistency(torch) is None
    facts = EngineFacts.from_status(parse_status({"engine": {"tokensPerBlock": 32, "maxBatchSize": 64}}))
    assert facts == FACTS and EngineFacts.from_status(parse_status({"engine": {"tokensPerBlock": "x"}})) == EngineFacts()
    assert EngineFacts.from_status(parse_status({"engine": {"tokensPerBlock": -32, "maxBatchSize": 0}})) == EngineFacts()


@pytest.fixture
def looping(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The real per-engine loop with a fake reconcile (one serving pod) and a fake metrics session."""
    state: dict[str, Any] = {"reconciles": 0, "session": FakeSession({"/metrics": (200, b'[{"kvCacheStats": 1}]')})}

    async def reconcile(api: Any, engine: Any, status: dict[str, Any], settings: Any, kv: Any, **_: Any) -> Any:
        state["reconciles"] += 1
        p = plan(engine, Observed(status=parse_status(status), claim_phase="Bound"), Settings(), datetime.now(timezone.utc))
        p = replace(p, written=status_dict(p.status))  # as reconcile() returns it, having written it
        return p, Observed(pods=(POD,))

    monkeypatch.setattr(loop_module, "reconcile", reconcile)
    monkeypatch.setattr(MetricsSource, "session", lambda self: state["session"])
    return state


def _run_loop(seconds: float) -> VirtualTime:
    """The loop of one autotuned engine for ``seconds`` of virtual time after its first reconcile."""
    vt = VirtualTime()

    async def run() -> None:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30,  # type: ignore[arg-type]
                                        clock=vt.clock, wait=vt.wait, wall_clock=lambda: 1.8e9 + vt.now)
        doc = manifest(name="e1", autotune={"enabled": True, "intervalSeconds": 6, "warmupSeconds": 0})
        doc["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1})
        loops.observe("ADDED", doc)
        loop = loops.loops[("ns", "e1")]
        await vt.until(lambda: loop.wrote_status, "the first reconcile")  # it finds the pod
        loop.wake.set()  # a wake starts sampling at once
        await vt.run_until(vt.now + seconds)
        await loops.stop_all()

    asyncio.run(run())
    return vt


def test_hostile_metrics_never_make_the_loop_spin(looping: dict[str, Any]) -> None:
    _run_loop(1.5)
    # Sampling every max(1, 6/6) = 1 s: two scrapes in 1.5 s. The hot loop of issue 13 made ~30 (one per 50 ms).
    assert 1 <= looping["session"].calls <= 3
    assert looping["reconciles"] >= 1


def test_a_sample_that_crashes_still_advances_the_next_sample(looping: dict[str, Any], monkeypatch) -> None:
    calls = []

    async def crash(self: Any, *_: Any) -> None:
        calls.append(1)
        raise RuntimeError("a bug in sampling")

    monkeypatch.setattr(MetricsSource, "sample", crash)
    _run_loop(1.5)
    assert 1 <= len(calls) <= 3  # before the fix: a sample every pass, ~30 in 1.5 s


@pytest.mark.parametrize("crash", [False, True], ids=["hostile-replies", "sampling-raises"])
def test_no_hot_loop_under_an_injected_clock(looping: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                             crash: bool) -> None:
    """The loop's clock and its waits run on virtual time: 120 virtual seconds of hostile replies (every sample
    rejected), or of a sampling step that raises, take a handful of real ones, and the samples must follow the
    sampling period (1 s here; hostile replies back the pod off further), not the 50 ms floor of the wait (the
    hot loop of issue 13: ~2,400 in 120 s)."""
    if crash:
        async def crashing(self: Any, *_: Any) -> None:
            looping["session"].calls += 1
            raise RuntimeError("a bug in sampling")

        monkeypatch.setattr(MetricsSource, "sample", crashing)

    vt = _run_loop(120)
    scrapes = looping["session"].calls
    print(f"virtual {vt.now:.0f} s: {scrapes} scrapes, {looping['reconciles']} reconciles")
    if crash:
        # At most one per second of (virtual) sampling time — the loop may run past 120 s before the test stops
        # it; a hot loop does ~20 per second.
        assert 20 <= scrapes <= vt.now + 5
    else:
        # A refused reply backs the pod off (5, 10, 20, 40, 80 s: issue 22): about 5 in 120 s, not 120.
        assert 3 <= scrapes <= 7
    # Reconciles keep their own period (a Progressing engine re-plans every 15 s): sampling failures never
    # postpone them (before the fix: 1 reconcile in 120 s).
    assert looping["reconciles"] >= 6
