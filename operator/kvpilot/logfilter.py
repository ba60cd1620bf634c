"""Rate-limited warnings: the first of a kind is logged, repeats at most once per window with a count.

A pod whose metrics cannot be read fails every 5 s; at 1,000 engines that was 27,000 WARNING lines in
nine minutes, burying everything else. This filter keys a record by its message template and its arguments
but the last (the pod, or the engine; the last is the error text, which varies), so each distinct problem
still shows up at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

MAX_KEYS = 10_000


class RepeatFilter(logging.Filter):
    def __init__(self, window_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window = window_seconds
        self.clock = clock
        self._last: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        key = (str(record.msg), repr(args[:-1]))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.window:
            self._last[key] = (last[0], last[1] + 1)
            return False
        suppressed = last[1] if last else 0
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > MAX_KEYS:
            self._last.popitem(last=False)
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} repeats in the last {self.window:.0f}s suppressed)"
        return True


def install(logger_names: tuple[str, ...], window_seconds: float = 300.0) -> RepeatFilter:
    """Attach one filter to the loggers that repeat per pod or per engine."""
    f = RepeatFilter(window_seconds)
    for name in logger_names:
        logging.getLogger(name).addFilter(f)
    return f
