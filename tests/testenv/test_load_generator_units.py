"""The e2e load generator (hack/closedloop.generate_load) offers the rate it is asked for, however slow the
callables that follow the cluster are: the tests that wait for the tuner to raise rely on the queue that rate
builds. A real aiohttp server stands in for a pod's OpenAI endpoint (it streams one chunk and [DONE])."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from hack import closedloop


async def _serve(requests: list[float]) -> tuple[web.AppRunner, str]:
    async def completions(request: web.Request) -> web.StreamResponse:
        requests.append(time.monotonic())
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "hi"}]}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


def _run(rate: float, seconds: float, lookup_s: float, stop_after_s: float | None = None,
         fail_lookup: int = 0) -> tuple[list[float], float, int]:
    """(when the server saw each request, the seconds the run took, the endpoint lookups made) for a run whose
    ``endpoints`` and ``stop`` each block ``lookup_s`` (a slow kubectl); lookup number ``fail_lookup`` raises."""

    async def main() -> tuple[list[float], float, int]:
        seen: list[float] = []
        runner, endpoint = await _serve(seen)
        lookups = [0]
        started = time.monotonic()

        def endpoints() -> list[str]:
            lookups[0] += 1
            time.sleep(lookup_s)
            if lookups[0] == fail_lookup:
                raise RuntimeError("kubectl get endpoints: the connection to the server was refused")
            return [endpoint]

        def stop() -> bool:
            time.sleep(lookup_s)
            return stop_after_s is not None and time.monotonic() - started > stop_after_s

        stats = closedloop.LoadStats()
        try:
            await closedloop.generate_load(endpoints, rate=rate, seconds=seconds, prompt_words=3, max_tokens=1,
                                           stats=stats, stop=stop)
        finally:
            await runner.cleanup()
        assert stats.errors == 0 and stats.ok == stats.sent == len(seen)
        return seen, time.monotonic() - started, lookups[0]

    return asyncio.run(main())


def test_slow_endpoint_lookups_do_not_slow_the_arrivals() -> None:
    # 40 req/s for 3 s is 120 expected arrivals (Poisson: sd 11; seed 1 draws 121). Each lookup blocks 0.3 s:
    # awaited between arrivals, as the generator did before, they let 42 of the 121 through (measured).
    # Nor are the arrivals sent in one burst: they span the 3 s of the schedule.
    seen, _, lookups = _run(rate=40, seconds=3, lookup_s=0.3)
    assert 90 <= len(seen) <= 150, len(seen)
    assert seen[-1] - seen[0] >= 2.5, seen[-1] - seen[0]
    assert lookups >= 4  # the endpoints were followed while the arrivals went on


def test_stop_ends_the_arrivals_long_before_the_seconds_asked_for() -> None:
    seen, spent, _ = _run(rate=40, seconds=30, lookup_s=0.2, stop_after_s=1.0)
    assert spent < 10, spent  # not the 30 s asked for
    assert 10 <= len(seen) <= 400, len(seen)


def test_a_lookup_that_fails_ends_the_run_and_fails_the_caller() -> None:
    with pytest.raises(RuntimeError, match="connection to the server was refused"):
        _run(rate=40, seconds=30, lookup_s=0.05, fail_lookup=3)
