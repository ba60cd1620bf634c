"""A pass cancelled while its writes are in flight (the engine, or its namespace, went away) leaves no failure
unread: asyncio would log each as "Task exception was never retrieved", at ERROR, with the API server's 403."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from kvpilot.k8s.errors import Forbidden
from kvpilot.k8s.writes import ChildWriter


class _NoApi:
    """ChildWriter.write_all touches no API: the writes are the coroutines it is handed."""


def test_a_cancelled_pass_reads_the_failures_of_its_writes() -> None:
    unread: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unread.append(ctx))
        writer = ChildWriter(_NoApi(), wait_seconds=30.0)  # type: ignore[arg-type]
        release = asyncio.Event()

        async def write() -> None:
            await release.wait()
            raise Forbidden("namespace e2e is being terminated")

        pass_task = asyncio.ensure_future(writer.write_all("e2e", [("Deployment e1", write())]))
        await asyncio.sleep(0.01)
        pass_task.cancel()
        try:
            await pass_task
        except asyncio.CancelledError:
            pass
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(scenario())
    gc.collect()
    assert not [c for c in unread if "never retrieved" in str(c.get("message"))], unread
