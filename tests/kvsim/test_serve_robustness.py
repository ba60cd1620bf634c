"""kvsim's HTTP server under hostile or careless clients (issue 13, item 8): abandoned requests are
aborted and free their KV blocks, bad fields are 400s checked before submission, slow clients are cut
off, and finished-request records do not pile up. Figures are printed (run with -s to see them)."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import tracemalloc

import aiohttp
import pytest
from aiohttp import web
from kvsim.serve.app import build_app
from kvsim.serve.args import parse
from kvsim.serve.settings import resolve

from .helpers import built_engine_dir
from .serve_process import serve

EXTRA = "return_perf_metrics: true\nkv_cache_config: {free_gpu_memory_fraction: 0.9, enable_block_reuse: true}\n"
PROMPT = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return built_engine_dir(tmp_path_factory.mktemp("engine"), EXTRA)


def settings_for(engine_dir, speedup: str = "1"):
    args = parse([str(engine_dir / "engine"), "--backend", "tensorrt", "--max_batch_size", "64",
                  "--extra_llm_api_options", str(engine_dir / "extra.yaml")])
    # 1.3: the release whose TensorRT backend accepts return_perf_metrics (PR #10662)
    return resolve(args, {"KVSIM_PROFILE": "llama-3.1-8b-fp8-h100", "KVSIM_SPEEDUP": speedup,
                          "KVSIM_TRTLLM_RELEASE": "1.3"})


class InProcess:
    """The real aiohttp app on a local port, in this event loop, so the test can look inside the engine."""

    def __init__(self, settings) -> None:
        self.app = build_app(settings)
        self.server = self.app["server"]

    async def __aenter__(self) -> InProcess:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.base = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    async def settle(self, timeout_s: float = 10.0) -> float:
        """Seconds until no request is left in the server or the engine."""
        t0 = time.monotonic()
        while self.server.handles or not self.server.engine.idle:
            if time.monotonic() - t0 > timeout_s:
                break
            await asyncio.sleep(0.05)
        return time.monotonic() - t0


class Barrier:
    """Releases the streams only once all of them are generating, so the test sees what they hold."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.open = parties, 0, asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived == self.parties:
            self.open.set()
        await self.open.wait()


async def abandon_stream(session: aiohttp.ClientSession, base: str, chat: bool, barrier: Barrier) -> None:
    """Start a long streamed generation, read its first chunk, wait for the others, then hang up."""
    body = {"model": "m", "max_tokens": 4000, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    else:
        body["prompt"] = PROMPT
    resp = await session.post(f"{base}/v1/{'chat/completions' if chat else 'completions'}", json=body)
    assert resp.status == 200
    async for line in resp.content:
        if line.startswith(b"data:"):
            break
    await barrier.wait()
    resp.close()  # drops the connection


async def time_out_unary(session: aiohttp.ClientSession, base: str) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await session.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4000},
                           timeout=aiohttp.ClientTimeout(total=0.5))


def test_abandoned_streams_and_timed_out_requests_free_their_blocks_and_memory(engine_dir) -> None:
    async def scenario() -> None:
        async with InProcess(settings_for(engine_dir)) as srv:
            engine = srv.server.engine
            idle_used = engine.pool.used
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                tracemalloc.start()
                sizes = []
                for round_no in range(5):
                    barrier = Barrier(64)
                    held: list[int] = []

                    async def measure(b: Barrier = barrier, out: list[int] = held) -> None:
                        await b.open.wait()
                        out.append(engine.pool.used)

                    await asyncio.gather(
                        measure(), *[abandon_stream(session, srv.base, i % 2 == 0, barrier) for i in range(64)],
                        *[time_out_unary(session, srv.base) for _ in range(16)])
                    busy_used = held[0]
                    settle_s = await srv.settle()
                    # Iteration stats wait in a bounded queue (iter_stats_max_iterations) for GET /metrics:
                    # read them, as the operator does, so the figure measures what requests leave behind.
                    async with session.get(f"{srv.base}/metrics") as resp:
                        assert resp.status == 200
                    gc.collect()
                    sizes.append(tracemalloc.get_traced_memory()[0])
                    print(f"round {round_no}: 64 streams generating held {busy_used - idle_used} blocks; after they "
                          f"and 16 timed-out requests hung up, idle again "
                          f"after {settle_s:.2f} s with {engine.pool.used} used blocks (idle {idle_used}); "
                          f"traced memory {sizes[-1] / 1024:.0f} KiB")
                    assert busy_used > idle_used  # they really held blocks
                    assert not srv.server.handles and engine.idle
                    assert engine.pool.used == idle_used
                tracemalloc.stop()
            assert srv.server.aborted == 5 * 80
            # Without the abort the engine would still run 4000-token generations (about a minute each).
            growth = sizes[-1] - sizes[1]
            print(f"traced memory growth over rounds 2-5 (320 abandoned requests): {growth / 1024:.0f} KiB")
            assert growth < 512 * 1024

    asyncio.run(scenario())


def test_finished_request_records_do_not_accumulate(engine_dir) -> None:
    async def scenario() -> None:
        async with InProcess(settings_for(engine_dir, speedup="1000")) as srv:
            async with aiohttp.ClientSession() as session:
                async def one() -> None:
                    async with session.post(f"{srv.base}/v1/completions",
                                            json={"prompt": "hi", "max_tokens": 2}) as resp:
                        assert resp.status == 200

                tracemalloc.start()
                sizes = []
                for _ in range(3):
                    for _ in range(10):
                        await asyncio.gather(*[one() for _ in range(100)])
                    await srv.settle()
                    gc.collect()
                    sizes.append(tracemalloc.get_traced_memory()[0])
                tracemalloc.stop()
            assert srv.server.engine.finished_requests() == []
            print(f"traced memory after 1000/2000/3000 requests: {[round(s / 1024) for s in sizes]} KiB")
            assert sizes[-1] - sizes[0] < 512 * 1024  # was about 600 bytes per request before the bound

    asyncio.run(scenario())


BAD = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": 5}]}]}, "text must be a string"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [7]}]}, "content part 0"),
    ("/v1/chat/completions", {"messages": [{"role": 3, "content": "x"}]}, "role"),
    ("/v1/chat/completions", {"messages": "hello"}, "messages"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": "x"}, "stream_options"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream must be a boolean"),
    ("/v1/completions", {"prompt": "x", "model": 5}, "model must be a string"),
    ("/v1/completions", {"prompt": [], "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": [-1, 2]}, "prompt"),
    ("/v1/completions", {"prompt": [True]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "9"}, "max_tokens"),
    ("/v1/completions", {"prompt": {"a": 1}}, "prompt"),
]


def test_bad_fields_are_400s_checked_before_submission(engine_dir) -> None:
    async def scenario() -> None:
        async with InProcess(settings_for(engine_dir)) as srv:
            async with aiohttp.ClientSession() as session:
                for path, body, words in BAD:
                    async with session.post(srv.base + path, json=body) as resp:
                        text = await resp.text()
                        assert resp.status == 400, (body, resp.status, text)
                        assert words in json.loads(text)["message"], (body, text)
                async with session.post(srv.base + "/v1/completions", data=b"[" * 100000) as resp:
                    assert resp.status == 400
                # A model name trtllm-serve does not serve is accepted, as trtllm-serve does.
                async with session.post(srv.base + "/v1/completions",
                                        json={"prompt": "x", "model": "anything", "max_tokens": 1}) as resp:
                    assert resp.status == 200
            assert srv.server._ids == 1  # nothing but the good request reached the engine

    asyncio.run(scenario())


def test_slow_clients_are_cut_off(engine_dir) -> None:
    """A connection that never finishes its headers is closed by the header timeout (10 s)."""
    with serve([str(engine_dir / "engine"), "--backend", "tensorrt", "--max_batch_size", "8"]) as (base, _proc):
        port = int(base.rsplit(":", 1)[1])
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            sock.settimeout(30)
            closed = sock.recv(1024)
        elapsed = time.monotonic() - t0
        print(f"half-sent headers: connection closed after {elapsed:.1f} s")
        assert closed == b"" and elapsed < 20
