"""The bars a rollback leaves (issue 18): after a change measured worse, no change in that direction, as far as
the midpoint or beyond, for a planning horizon and at the load it was measured at. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.autotune.verify import Side, same_load


@dataclass(frozen=True)
class Bar:
    """After a rollback (or a lower that did not help): no change in that direction (``upward``) to ``limit`` or
    beyond it until ``until_s``, while the load is the one it was measured at (``offered_per_s`` requests per
    second, mean prompt ``prompt_mean``; 0: unknown, the bar holds whatever the load). Measured at one load, it
    says nothing of another: after a phase shift the barred direction may be the right one."""

    upward: bool
    limit: int
    until_s: float
    offered_per_s: float = 0.0
    prompt_mean: float = 0.0

    def refuses(self, current: int, target: int, now_s: float, load: tuple[float, float] | None = None) -> bool:
        """``load``: the offered requests per second and the mean prompt now (None: unknown)."""
        if now_s >= self.until_s or (target > current) != self.upward:
            return False
        if load is not None and self.offered_per_s > 0 and not same_load(load, (self.offered_per_s, self.prompt_mean)):
            return False
        return target >= self.limit if self.upward else target <= self.limit


def bar_after_rollback(from_value: int, to_value: int, at_s: float, horizon_s: float,
                       earlier: tuple[Bar, ...] = (), load: Side | None = None) -> Bar:
    """The bar a rollback of ``from_value`` -> ``to_value`` leaves for the planning horizon: the geometric midpoint
    between the value that served well and the one that failed, and everything beyond it (the next try in that
    direction goes at most half as far, in ratio); a second rollback in the same direction within the horizon
    bars the whole direction. Why not the whole direction at once: on issue 18's example (an engine 20% slower
    than its profile, the cliff above 256), a raise 64 -> 512 fails while 64 -> 128 serves 1.42x what 64 does."""
    upward = to_value > from_value
    rate, prompt = (load.offered_per_s, load.prompt_mean) if load is not None else (0.0, 0.0)
    if any(b.upward == upward and b.until_s > at_s for b in earlier):
        return Bar(upward, from_value + 1 if upward else from_value - 1, at_s + horizon_s, rate, prompt)
    mid = math.sqrt(from_value * to_value)
    return Bar(upward, math.ceil(mid) if upward else math.floor(mid), at_s + horizon_s, rate, prompt)
