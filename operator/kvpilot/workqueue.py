"""Bounded, prioritized reconcile slots: the operator's work queue.

Each InferenceEngine has one loop, so an engine is never queued twice (woken ten times while waiting, it
reconciles once: per-engine deduplication). What this adds is the bound and the order: at most ``size``
reconciles run at once, and an engine with a pending change (a spec edit, a child event) is served before
the engines that are only due for their periodic resync, so a burst of resyncs cannot delay a real change.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

CHANGE = 0  # something changed: reconcile first
RESYNC = 1  # only due for the periodic check


class PrioritySlots:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"the number of concurrent reconciles must be at least 1, got {size}")
        self.size = size
        self._free = size
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for _p, _s, f in self._waiters if not f.done())

    @property
    def running(self) -> int:
        return self.size - self._free

    @asynccontextmanager
    async def hold(self, priority: int) -> AsyncIterator[None]:
        if self._free > 0 and not self.waiting:
            self._free -= 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, (priority, next(self._seq), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # the slot was handed over as we were cancelled
                    self._release()
                else:
                    fut.cancel()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiters:
            _p, _s, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)  # hand the slot over directly: no one can overtake the queue
                return
        self._free += 1
