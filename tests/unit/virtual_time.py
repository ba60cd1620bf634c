"""Virtual time for the per-engine loops (``EngineLoops(clock=..., wait=...)``): no test sleeps on the wall clock.

A wait that nothing wakes ends at once and moves the clock by its whole timeout, so minutes of the loop's
schedule run in milliseconds, and every wait the loop asked for is recorded (a loop that spins shows as many
short waits, whatever the machine's speed).
"""

from __future__ import annotations

import asyncio
from typing import Callable

MAX_TURNS = 100_000  # event-loop turns a test may wait for a condition before it fails instead of hanging


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def wait(self, wake: asyncio.Event, timeout: float) -> None:
        """As ``loop.wait_for_wake``: a wake already set (or set while other tasks run) ends it early."""
        self.waits.append(timeout)
        await asyncio.sleep(0)
        if not wake.is_set():
            self.now += timeout

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Let the loops run until ``condition`` holds."""
        for _ in range(MAX_TURNS):
            if condition():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"never happened: {what} (virtual time {self.now:.1f} s)")

    async def run_until(self, seconds: float) -> None:
        """Let the loops run until the virtual clock reaches ``seconds``."""
        await self.until(lambda: self.now >= seconds, f"the clock reaching {seconds} s")
