"""The aiohttp application of the simulated trtllm-serve: trtllm-serve's routes, wired to their handlers.

The server's own routes (health, version, models, metrics) are ``SimServer`` methods (server.py); the OpenAI
routes are ``OpenAIRoutes`` (openai_api.py), which builds on the server. Building the routes here, apart from
both, keeps the imports one-way: app -> openai_api -> server.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from .openai_api import OpenAIRoutes
from .server import SimServer
from .settings import ServeSettings


def build_app(settings: ServeSettings) -> web.Application:
    server = SimServer(settings)
    routes = OpenAIRoutes(server)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["server"] = server
    app.router.add_get("/health", server.health)
    app.router.add_get("/health_generate", server.health_generate)
    app.router.add_get("/version", server.version)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/metrics", server.iteration_stats)
    if settings.return_perf_metrics:
        app.router.add_get("/prometheus/metrics", server.prometheus)
        app.router.add_get("/prometheus/metrics/", server.prometheus)
        app.router.add_get("/perf_metrics", server.perf)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)

    async def start_engine(app: web.Application) -> None:
        server._task = asyncio.create_task(server.run_engine())

    async def stop_engine(app: web.Application) -> None:
        if server._task is not None:
            server._task.cancel()
            try:
                await server._task
            except (asyncio.CancelledError, Exception):
                pass

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    return app

