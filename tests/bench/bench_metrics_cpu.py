"""What one serving pod's metrics replies cost the operator (issue 22, item 5): CPU of the sampler against a pod
that answers 8 MiB, and the real payload sizes that set the reply limit.

Payload sizes: kvsim's iteration-stats queue filled (``iter_stats_max_iterations`` 1000, trtllm-serve's default and
the most a reply holds) at max_batch_size 2048, saturated, on both backends; the bytes are those of the JSON reply.

CPU: a pod (a separate process, so its own CPU is not counted) answers ``/metrics`` with a reply of the given size
made of kvsim-shaped iteration objects; the operator's real ``EngineSampler`` reads it every second (the shortest
sampling period, ``sample_seconds``) for ``DURATION`` seconds; the figure is the operator process's CPU time
(``time.process_time``: every thread, the parsing worker included) over the wall time. "before" replays the old
rules (an 8 MiB limit, a refused reply not backed off) on the same machine. Target: <= 5% of a core.

Run: ``python -m tests.bench.bench_metrics_cpu [seconds]`` (prints figures; asserts nothing about time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

import aiohttp

from kvpilot.desired.observed import PodState
from kvpilot.observe import replies, scrape
from kvpilot.observe.scrape import EngineFacts, EngineSampler

DURATION = 30.0
MIB = 2**20

SERVER = r"""
import json, sys, time
from aiohttp import web
from kvsim.config import EngineConfig
from kvsim.engine import Engine
from kvsim.request import Request

size, port, chunked = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "chunked"
e = Engine(EngineConfig(build_max_batch_size=2048, max_batch_size=2048), epoch_s=time.time())
for i in range(3000):
    e.submit(Request(prompt_tokens=2000, output_tokens=400, max_tokens=400, request_id=i))
t = 0.0
while len(e._stats) < e._stats.maxlen:
    t += 0.5
    e.advance_to(t)
items = e.drain_iteration_stats()
out, total = [], 2
while True:
    item = {**items[len(out) % len(items)], "iter": len(out)}
    total += len(json.dumps(item).encode()) + 2
    if total > size and out:
        break
    out.append(item)
body = json.dumps(out).encode()

async def metrics(request):
    if not chunked:
        return web.Response(body=body, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})  # no Content-Length
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        for i in range(0, len(body), 2**16):
            await resp.write(body[i:i + 2**16])
        await resp.write_eof()
    except ConnectionError:  # the operator stops reading at its limit
        pass
    return resp

app = web.Application()
app.router.add_get("/metrics", metrics)
print(len(body), flush=True)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""


def payload_sizes() -> dict[str, int]:
    """Bytes of a full /metrics reply of kvsim at max_batch_size 2048, per backend."""
    from kvsim.config import Backend, EngineConfig
    from kvsim.engine import Engine
    from kvsim.request import Request

    out = {}
    for name, extra in (("tensorrt", {}), ("pytorch", {"backend": Backend.PYTORCH})):
        engine = Engine(EngineConfig(build_max_batch_size=2048, max_batch_size=2048, **extra), epoch_s=time.time())
        for i in range(6000):
            engine.submit(Request(prompt_tokens=2000, output_tokens=400, max_tokens=400, request_id=i))
        t = 0.0
        while len(engine._stats) < (engine._stats.maxlen or 0):
            t += 0.5
            engine.advance_to(t)
        out[name] = len(json.dumps(engine.drain_iteration_stats()).encode())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pod_serving(size: int, chunked: bool = False) -> Iterator[tuple[int, int]]:
    """A pod process answering /metrics with at most ``size`` bytes of iteration objects; yields (port, bytes)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(size), str(port), "chunked" if chunked else "plain"],
                            stdout=subprocess.PIPE, text=True)
    try:
        exact = int((proc.stdout.readline() if proc.stdout else "0").strip() or 0)
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield port, exact
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _sample_for(port: int, seconds: float) -> tuple[float, float, int, int]:
    pod = PodState("bench-0", ready=True, fingerprint=None, ip="127.0.0.1")
    sampler = EngineSampler()
    reads = 0
    async with aiohttp.ClientSession() as session:
        wall0, cpu0 = time.monotonic(), time.process_time()
        while time.monotonic() - wall0 < seconds:
            started = time.monotonic()
            before = sampler.pods.get(pod.name)
            due = before is None or before.backoff is None or sampler.clock() >= before.backoff.retry_at
            await sampler.tick(session, [pod], port=port, now=datetime.now(timezone.utc), warmup_seconds=0,
                               want_latency=False, facts=EngineFacts())
            reads += int(due)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    kept = sum(len(r.samples) for r in sampler.pods.values())
    return cpu, wall, reads, kept


@contextmanager
def old_rules() -> Iterator[None]:
    """The rules before issue 22: any reply up to 8 MiB parsed, a refused reply retried at once."""
    saved = scrape.POD_REPLY_BYTES, scrape.BACKOFF_BASE_SECONDS
    scrape.POD_REPLY_BYTES, scrape.BACKOFF_BASE_SECONDS = replies.MAX_BODY_BYTES, 0.0
    try:
        yield
    finally:
        scrape.POD_REPLY_BYTES, scrape.BACKOFF_BASE_SECONDS = saved


def measure(label: str, size: int, seconds: float, before: bool = False, chunked: bool = False) -> None:
    with pod_serving(size, chunked) as (port, exact):
        if before:
            with old_rules():
                cpu, wall, reads, kept = asyncio.run(_sample_for(port, seconds))
        else:
            cpu, wall, reads, kept = asyncio.run(_sample_for(port, seconds))
    print(f"  {label:<44} {exact / MIB:6.2f} MiB  {reads:4d} reads  {kept:7d} samples kept  "
          f"{100 * cpu / wall:5.1f}% of a core ({cpu:.2f} CPU-s in {wall:.0f} s)", flush=True)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 and __name__ == "__main__" else DURATION
    seconds = float(os.environ.get("KVPILOT_BENCH_METRICS_SECONDS", seconds))
    logging.getLogger("kvpilot.observe.scrape").setLevel(logging.ERROR)  # the refusals, once a read each
    sizes = payload_sizes()
    print("metrics replies: kvsim, 1000 iterations (a full stats queue) at max_batch_size 2048: "
          + ", ".join(f"{k} {v:,} bytes" for k, v in sizes.items())
          + f"; pod reply limit {scrape.POD_REPLY_BYTES:,} bytes")
    print(f"operator CPU against one pod read every second, {seconds:.0f} s each (target <= 5% of a core):")
    measure("8 MiB reply, before (8 MiB limit, no back-off)", 8 * MIB - 4096, seconds, before=True)
    measure("8 MiB reply, now (refused, backed off)", 8 * MIB, seconds)
    measure("8 MiB chunked, no length (read to 2 MiB, refused)", 8 * MIB, seconds, chunked=True)
    measure("largest reply accepted now (just under 2 MiB)", scrape.POD_REPLY_BYTES - 4096, seconds)
    measure("a full kvsim queue (1000 iterations)", max(sizes.values()), seconds)


if __name__ == "__main__":
    main()
