"""The simulated trtllm-serve: an engine that runs in (scaled) real time, and the handlers of its own routes.

A background task advances the engine to "now" (wall time since start x KVSIM_SPEEDUP) every few
milliseconds and hands newly generated tokens to waiting handlers; idle, it sleeps until a request arrives.
Tokens are delivered when the simulated iteration that produced them has started, so a client sees at most
one iteration early. Routes: /health, /health_generate, /version, /v1/models, /v1/completions,
/v1/chat/completions (streaming via SSE too), /metrics (iteration stats, drained on read), /perf_metrics and
/prometheus/metrics (when ``return_perf_metrics`` is on, like the real server).

The OpenAI routes (openai_api.py) build on ``SimServer``; app.py wires both into one aiohttp application,
so neither of these modules imports the other's caller.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from ..engine import Engine
from ..request import Request, RequestRecord
from .prom import ServeMetrics
from .settings import ServeSettings

TICK_S = 0.002
DEFAULT_MAX_TOKENS = 32  # TensorRT-LLM SamplingParams.max_tokens default
DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


class ClientGone(Exception):
    """The client closed its connection (or timed out) before its request finished."""


@dataclass
class Handle:
    record: RequestRecord
    key: int = 0
    produced: int = 0
    done: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


class SimServer:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.started_monotonic = time.monotonic()
        # The server hands each finished record to its client: the engine keeps none (bounded memory).
        self.engine = Engine(settings.engine, epoch_s=time.time(), time_scale=settings.speedup, keep_finished=0)
        rel = settings.release
        # The iteration gauges come from the iteration stats, which the PyTorch backend keeps only with
        # enable_iter_perf_stats (PR #19418 made that explicit); the per-request histograms need nothing more.
        gauges = (rel.iteration_gauges if rel else True) and (settings.backend != "pytorch" or settings.iter_perf_stats)
        self.metrics = ServeMetrics(self.engine, settings.model_id, rel.prometheus_prefix if rel else "trtllm_", gauges)
        self.handles: dict[int, Handle] = {}
        self.perf_metrics: list[dict] = []
        self.created = int(time.time())
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._ids = 0
        self.aborted = 0  # requests cancelled because their client went away

    # -- clock and engine loop ------------------------------------------------------------------------------
    def sim_now(self) -> float:
        return (time.monotonic() - self.started_monotonic) * self.settings.speedup

    async def run_engine(self) -> None:
        self._wake = asyncio.Event()
        while True:
            self.engine.advance_to(self.sim_now())
            self._dispatch()
            if self.engine.idle and not self.handles:
                self._wake.clear()
                await self._wake.wait()
            else:
                await asyncio.sleep(TICK_S)

    def _dispatch(self) -> None:
        for key, handle in list(self.handles.items()):
            produced = self.engine.progress(handle.record)
            finished = handle.record.finish_s is not None
            if produced != handle.produced or finished:
                handle.produced = produced
                handle.done = finished
                handle.event.set()
            if finished:
                del self.handles[key]
                self.metrics.observe(handle.record)
                if self.settings.return_perf_metrics:
                    self._keep_perf_metrics(handle.record)

    def _keep_perf_metrics(self, r: RequestRecord) -> None:
        self.perf_metrics.append({"request_id": r.request_id, "perf_metrics": {"timing_metrics": {
            "arrival_time": r.arrival_s, "first_scheduled_time": r.start_s, "first_token_time": r.first_token_s,
            "last_token_time": r.finish_s}, "kv_cache_metrics": {"num_reused_blocks": r.reused_blocks}}})
        del self.perf_metrics[:-1000]

    def submit(self, prompt_ids: list[int], max_tokens: int) -> Handle:
        """Queue a request now; RequestRejected carries TensorRT-LLM's reason."""
        self._ids += 1
        request = Request(prompt_tokens=len(prompt_ids), output_tokens=max_tokens, max_tokens=max_tokens,
                          request_id=self._ids, prompt_token_ids=prompt_ids)
        record = self.engine.submit(request, now_s=max(self.sim_now(), self.engine.now))
        handle = Handle(record, key=self._ids)
        self.handles[self._ids] = handle
        if self._wake is not None:
            self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        """The client went away: cancel its request so it frees its slot and KV blocks at once, as
        trtllm-serve does (its handlers await ``await_disconnected`` and abort the request's promise)."""
        if self.handles.pop(handle.key, None) is None or handle.done:
            return
        self.engine.advance_to(self.sim_now())  # settle the iterations that already ran
        if self.engine.abort(handle.record):
            self.aborted += 1
        handle.done = True
        if self._wake is not None:
            self._wake.set()

    async def wait(self, request: web.Request, handle: Handle) -> None:
        """Wait for new tokens (or completion) of ``handle``; ClientGone if the client disconnected."""
        while True:
            try:
                await asyncio.wait_for(handle.event.wait(), DISCONNECT_POLL_S)
                handle.event.clear()
                woke = True
            except asyncio.TimeoutError:
                woke = False
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ClientGone
            if woke:
                return

    # -- routes ----------------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self._task is None or self._task.done():
            return web.Response(status=503, text="LLM is unavailable. Please check the server logs for more details.")
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        try:
            handle = self.submit([1, 2, 3], 1)
            while not handle.done:
                await handle.event.wait()
                handle.event.clear()
        except Exception:
            return web.Response(status=500, text="Generation health check failed")
        return web.Response(status=200, text="Generation health check OK")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.settings.version})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.settings.model_id, "object": "model", "created": self.created, "owned_by": "tensorrt_llm"}]})

    async def iteration_stats(self, request: web.Request) -> web.Response:
        if not self.settings.iter_perf_stats:
            return web.json_response([])
        return web.json_response(self.engine.drain_iteration_stats())

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def perf(self, request: web.Request) -> web.Response:
        out, self.perf_metrics = self.perf_metrics, []
        return web.json_response(out)


def error_response(message: str, status: int = 400, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                             status=status)
