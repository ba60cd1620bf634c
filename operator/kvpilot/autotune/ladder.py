"""The candidates a proposed change offers the what-if (autotune/whatif.py): the rules' target and the steps of a
doubling ladder in the same direction. Pure."""

from __future__ import annotations

import math


def candidates(current: int, target: int, lo: int, hi: int, deeper: bool = False) -> list[int]:
    """The rules' target and the steps a doubling ladder offers in the same direction, within the bounds (a
    lower also halves the target: protective lowers are sized from the batch that runs, which may still be
    too large when prefills, not the batch, break TPOT; and offers the step between, the target over the square
    root of two: measured on the suite's overloaded case with a 22 ms TPOT objective, a lower from 2048 chose
    between 89 (over the objective) and 44 (a third of the requests then missed TTFT), while 64 served best).
    ``deeper``: a lower ranked on the traffic still arriving (autotune/ahead.py) also offers the target over 2 sqrt(2)
    and over 4: the batch that runs, which sized the target, is the old traffic's. On chat then document Q&A without
    a spare GPU, on an engine decoding 23% faster than its profile, the ladder stopped at 82 where the documents
    wanted 29-51, and a second rolling restart followed (from 64: 14.194 req/s; offered 41 and 58, the model chose
    51 and the run served 15.129)."""
    if target > current:
        ladder = [current * 2, current * 4, current * 8]
    else:
        half, between = current // 2, round(target / math.sqrt(2))
        ladder = [half, target // 2] + ([between] if abs(between - half) > 0.1 * half else [])
        ladder += [target // 4, round(target / (2 * math.sqrt(2)))] if deeper else []
    return sorted({max(lo, min(hi, c)) for c in [target, *ladder]} - {current})
