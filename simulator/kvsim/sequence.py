"""A request inside the engine (``Seq``) and the states it moves through.

Its own module so that the engine's loop (engine.py) and the batch manager (scheduler.py) both import it and
neither imports the other's internals. States are plain ints, not an Enum: the scheduler compares them in its
hottest paths, and a module constant costs one global lookup there.

    QUEUED --admit--> ADMITTED --first chunk--> CONTEXT --last chunk--> GENERATION --finish/abort--> DONE
       ^                                            |                       |
       +----------------- pause (MAX_UTILIZATION) --+-----------------------+
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final

from .request import RequestRecord

QUEUED: Final = 0  # fetched into the batch (or paused), waiting for KV capacity
ADMITTED: Final = 1  # holds its blocks (or its reservation), no context chunk ran yet
CONTEXT: Final = 2  # prefilling, chunk by chunk
GENERATION: Final = 3  # decoding one token per iteration
DONE: Final = 4  # finished or aborted


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, eq=False)
class Seq(RequestRecord):
    """A request inside the engine: its public record plus scheduling state (finishing costs no copy).

    ``gen_base_G`` / ``gen_base_count``: the decode-iteration counter and the tokens generated when it entered
    GENERATION (tokens generated now = gen_base_count + G - gen_base_G); ``fin_G``: the counter value at which it
    finishes. ``version`` grows whenever a heap entry for it goes stale (pause, finish, abort).
    """

    seq_no: int = 0
    keys: tuple[Hashable, ...] = ()
    state: int = QUEUED
    ctx_target: int = 0
    ctx_done: int = 0
    blocks: list[int] = field(default_factory=list)
    blocks_total: int = 0
    keyed: int = 0
    phase: int = 0
    reserved: bool = False
    gen_base_G: int = 0
    gen_base_count: int = 0
    fin_G: int = 0
    version: int = 0
