"""A pod whose metrics cannot be read is backed off exponentially (bounded) and warned about at most once per
window (issue 12: at 1,000 engines, failed scrapes every 5 s were most of the idle operator's CPU and 27,000
WARNING lines in nine minutes). Driven by an injected clock: no sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone
from typing import Any

import aiohttp
import pytest

from kvpilot.desired.observed import PodState
from kvpilot.observe import scrape
from kvpilot.observe.scrape import EngineSampler, backoff_seconds
from tests.fuzz.make_metrics_corpus import GOOD

POD = PodState("e1-x", ready=True, fingerprint=None, ip="127.0.0.9")
OTHER = PodState("e1-y", ready=True, fingerprint=None, ip="127.0.0.10")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Reply:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.content = self

    async def read(self, n: int) -> bytes:
        piece, self.body = self.body[:n], self.body[n:]
        return piece

    async def __aenter__(self) -> Reply:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


class Session:
    """Refuses the connection for the pods in ``down``; answers one good sample otherwise. Counts /metrics reads."""

    def __init__(self, down: set[str]) -> None:
        self.down = down
        self.reads: dict[str, int] = {}

    def get(self, url: str, **_: Any) -> Reply:
        ip, path = url.split("/", 3)[2].split(":")[0], "/" + url.split("/", 3)[3]
        if path == "/metrics":
            self.reads[ip] = self.reads.get(ip, 0) + 1
        if ip in self.down:
            raise aiohttp.ClientConnectionError(f"Cannot connect to host {ip}")
        if path == "/metrics":
            return Reply(200, json.dumps([GOOD]).encode())
        return Reply(404, b"")


def tick(sampler: EngineSampler, session: Session, pods: list[PodState]) -> None:
    asyncio.run(sampler.tick(session, pods, port=8000, now=NOW, warmup_seconds=0,  # type: ignore[arg-type]
                             want_latency=False))


def backoff(sampler: EngineSampler, pod: str) -> scrape.PodBackoff:
    state = sampler.pods[pod].backoff
    assert state is not None, f"{pod} is not backed off"
    return state


def test_the_backoff_doubles_from_5_s_and_is_bounded() -> None:
    assert [backoff_seconds(n) for n in range(0, 8)] == [0, 5, 10, 20, 40, 80, 160, 300]
    assert backoff_seconds(10_000) == scrape.BACKOFF_MAX_SECONDS


def test_a_failing_pod_is_tried_less_and_less_often_and_the_others_every_tick() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    session = Session(down={POD.ip or ""})
    for _ in range(int(3600 / 5)):  # one hour of 5 s ticks
        tick(sampler, session, [POD, OTHER])
        clock[0] += 5
    # Failures at t = 0, 5, 15, 35, 75, 155, 315, then every 300 s: 7 + 10 in the hour, not 720.
    assert session.reads["127.0.0.9"] == 17
    assert session.reads["127.0.0.10"] == 720
    assert backoff(sampler, "e1-x").failures == 17
    assert sampler.pods["e1-y"].backoff is None and sampler.pods["e1-y"].samples


def test_a_success_resets_the_backoff() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    session = Session(down={POD.ip or ""})
    for _ in range(4):  # t = 0, 5, 15, 35 fail; next try at 75
        tick(sampler, session, [POD])
        clock[0] = backoff(sampler, "e1-x").retry_at
    assert backoff(sampler, "e1-x").failures == 4
    session.down.clear()
    tick(sampler, session, [POD])
    assert sampler.pods["e1-x"].backoff is None and sampler.pods["e1-x"].samples
    session.down.add(POD.ip or "")
    clock[0] += 5
    tick(sampler, session, [POD])
    assert backoff(sampler, "e1-x").failures == 1 and backoff(sampler, "e1-x").retry_at == clock[0] + 5


def test_a_pod_that_left_forgets_its_backoff() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    tick(sampler, Session(down={POD.ip or ""}), [POD])
    assert backoff(sampler, "e1-x").failures == 1
    tick(sampler, Session(down=set()), [OTHER])
    assert "e1-x" not in sampler.pods  # the whole record of the pod goes, in one step


def test_warnings_are_rate_limited_with_the_count(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tests may have disabled the logger (a logging config) or added the operator's repeat filter to it:
    # this test is about the sampler's own rate limit.
    logger = logging.getLogger("kvpilot.observe.scrape")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(logger, "propagate", True)
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    session = Session(down={POD.ip or ""})
    with caplog.at_level(logging.WARNING, logger="kvpilot.observe.scrape"):
        for _ in range(int(3600 / 5)):
            tick(sampler, session, [POD])
            clock[0] += 5
    warnings = [r.getMessage() for r in caplog.records if "e1-x" in r.getMessage()]
    # 17 failures in the hour; the first is warned at once, then at most one warning per 300 s.
    assert 1 < len(warnings) <= 1 + 3600 // int(scrape.WARN_EVERY_SECONDS)
    assert "1 failure(s) in a row" in warnings[0] and "Cannot connect" in warnings[0]
    assert sum(int(w.split(", ")[1].split(" since")[0]) for w in warnings) == 17


def test_a_reset_forgets_the_configuration_and_keeps_the_traffic_and_the_backoff() -> None:
    """reset() runs when the runtime batch size changed (a rollout): the window and the rejections describe the
    old configuration and go. The arrival history, the readings its next count compares with, and a pod's
    back-off depend on the traffic and on the pod, not on the configuration, and survive."""
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    session = Session(down={POD.ip or ""})
    for _ in range(4):  # t = 1000 .. 1015; e1-x fails at 1000, 1005 and 1015 (next try at 1035)
        tick(sampler, session, [POD, OTHER])
        clock[0] += 5
    sampler.reject(clock[0], "e1-y", "value", "a reply the engine cannot have sent")
    assert sampler.window(30) is not None and sampler.rejections and sampler.pods["e1-y"].samples
    arrivals, failures, retry_at = list(sampler.arrivals), backoff(sampler, "e1-x").failures, \
        backoff(sampler, "e1-x").retry_at
    assert arrivals and arrivals[-1][2] is None  # e1-x was due at 1015 and failed: no count

    sampler.reset()
    assert sampler.window(30) is None  # nothing of the old configuration, not even its rejection note
    assert not sampler.rejections and not any(r.samples or r.latency for r in sampler.pods.values())
    assert list(sampler.arrivals) == arrivals
    assert (backoff(sampler, "e1-x").failures, backoff(sampler, "e1-x").retry_at) == (failures, retry_at)

    reads = dict(session.reads)
    tick(sampler, session, [POD, OTHER])  # t = 1020
    assert session.reads["127.0.0.9"] == reads["127.0.0.9"]  # still backed off: not retried at once
    assert session.reads["127.0.0.10"] == reads["127.0.0.10"] + 1
    # Counted against the readings of 1015, which the reset kept (forgetting them would read as a pod that came).
    assert len(sampler.arrivals) == len(arrivals) + 1 and sampler.arrivals[-1][2] is not None


class BigSession(Session):
    """Answers ``body`` on /metrics for every pod (issue 22: a pod answering 8 MiB)."""

    def __init__(self, body: bytes) -> None:
        super().__init__(set())
        self.body = body

    def get(self, url: str, **kw: Any) -> Reply:
        reply = super().get(url, **kw)
        return Reply(200, self.body) if url.endswith("/metrics") and "/prometheus/" not in url else reply


def test_a_refused_reply_backs_the_pod_off_and_a_good_one_ends_it() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    too_big = b"[" + b" " * (scrape.POD_REPLY_BYTES + 1) + b"]"
    session = BigSession(too_big)
    for _ in range(10):  # one tick a second for 10 s
        tick(sampler, session, [POD])
        clock[0] += 1
    assert session.reads == {"127.0.0.9": 2}  # at 0 s, then 5 s later; the next is due at 15 s
    assert sampler.rejections and sampler.rejections[-1][2] == "size"
    session.body = json.dumps([GOOD]).encode()
    clock[0] += 10
    tick(sampler, session, [POD])
    assert sampler.pods["e1-x"].backoff is None and len(sampler.pods["e1-x"].samples) == 1


def test_a_reply_that_does_not_parse_backs_off_too() -> None:
    clock = [1000.0]
    sampler = EngineSampler(clock=lambda: clock[0])
    session = BigSession(b'[{"kvCacheStats": "not an object"}]')
    for _ in range(4):
        tick(sampler, session, [POD])
        clock[0] += 1
    assert session.reads == {"127.0.0.9": 1} and sampler.pods["e1-x"].backoff is not None


def test_replies_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    threads: list[int] = []
    original = scrape.parse_replies

    def spy(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return original(*args)

    monkeypatch.setattr(scrape, "parse_replies", spy)
    sampler = EngineSampler(clock=lambda: 1000.0)
    tick(sampler, Session(set()), [POD])
    assert threads and threads[0] != threading.get_ident()
    assert len(sampler.pods["e1-x"].samples) == 1


def test_the_samples_held_per_pod_are_capped() -> None:
    sampler = EngineSampler(clock=lambda: 1000.0)
    reply = json.dumps([{**GOOD, "iter": i} for i in range(1000)]).encode()
    for k in range(scrape.MAX_SAMPLES_PER_POD // 1000 + 5):
        sampler.accept("e1-x", 1000.0 + k, reply, None, scrape.EngineFacts())
    samples = sampler.pods["e1-x"].samples
    assert len(samples) == scrape.MAX_SAMPLES_PER_POD and samples[-1].timestamp_s >= samples[0].timestamp_s
