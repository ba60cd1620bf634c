"""TensorRT-LLM's in-engine dynamic batch tuner (executor/dynamicBatchTuner.cpp), re-implemented.

Each iteration the executor feeds (prompt length, max_new_tokens) of the active requests into moving windows
of ``window`` samples; the KV capacity batch size is ``blocks / ceil((avgISL + avgOSL) / tpb)``; a table maps
it to the runtime batch size (<144 -> 128, <336 -> 256, <672 -> 512, <832 -> 768, <1280 -> 1024,
<1664 -> 1536, else round down to a multiple of 512 when within 128 of it, else the capacity value); the
engine then runs with min(configured max_batch_size, that value). Optional max_num_tokens tuning: next power of
two of bs * ISL/OSL + bs, floored at 8192 / 4096 / 2048 for context-heavy / balanced / generation-heavy traffic.

kvsim's simplification (documented): the window is the last ``window`` active requests, recomputed when the
active set changes, instead of pushing every active request every iteration; the two agree whenever at least
``window`` requests are active and are close otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from .scheduler import Scheduler
from .sequence import Seq

BATCH_SIZE_TABLE = ((144, 128), (336, 256), (672, 512), (832, 768), (1280, 1024), (1664, 1536))
FALLBACK_GRANULARITY = 512
FALLBACK_THRESHOLD = 128


def runtime_batch_size(max_capacity_batch_size: int) -> int:
    """The tuner's table lookup."""
    for limit, batch in BATCH_SIZE_TABLE:
        if max_capacity_batch_size < limit:
            return batch
    threshold = max_capacity_batch_size // FALLBACK_GRANULARITY * FALLBACK_GRANULARITY
    if max_capacity_batch_size < threshold + FALLBACK_THRESHOLD:
        return threshold
    return max_capacity_batch_size


def runtime_max_num_tokens(batch_size: int, avg_input: float, avg_output: float) -> int:
    """The tuner's max_num_tokens rule (only used when max-num-tokens tuning is enabled)."""
    if avg_output <= 0:
        return 8192
    ratio = avg_input / avg_output
    adjusted = max(1.0, batch_size * ratio + batch_size)
    floor = 8192 if ratio > 2.0 else 4096 if ratio > 0.5 else 2048
    return max(1 << math.ceil(math.log2(adjusted)), floor)


def max_capacity_batch_size(num_blocks: int, avg_input: float, avg_output: float, tokens_per_block: int) -> int:
    """KVCacheManager::getMaxCapacityBatchSize: blocks / blocks needed by an average request."""
    per_request = max(1, math.ceil((int(avg_input) + int(avg_output)) / tokens_per_block))
    return num_blocks // per_request


class InEngineTuner:
    """The tuner's state inside one engine: its latest recommendations and whether the active set changed.

    ``update`` computes the runtime limits from the newest ``window`` active requests and writes them into the
    scheduler, which reads the limits from its own fields (so they are set where they change).
    """

    __slots__ = ("window", "num_blocks", "tokens_per_block", "tune_batch_size", "tune_num_tokens",
                 "max_batch_size", "max_num_tokens", "batch_size", "num_tokens", "dirty")

    def __init__(self, *, window: int, num_blocks: int, tokens_per_block: int, tune_batch_size: bool,
                 tune_num_tokens: bool, max_batch_size: int, max_num_tokens: int) -> None:
        self.window, self.num_blocks, self.tokens_per_block = window, num_blocks, tokens_per_block
        self.tune_batch_size, self.tune_num_tokens = tune_batch_size, tune_num_tokens
        self.max_batch_size, self.max_num_tokens = max_batch_size, max_num_tokens
        self.batch_size = 0  # maxBatchSizeTunerRecommended (0: no recommendation)
        self.num_tokens = 0  # maxNumTokensTunerRecommended
        self.dirty = True

    @property
    def enabled(self) -> bool:
        return self.tune_batch_size or self.tune_num_tokens

    def update(self, newest_first: Iterator[Seq], sched: Scheduler) -> None:
        """Recompute from the active requests, newest first; set ``sched.batch_size`` / ``max_num_tokens``."""
        self.dirty = False
        window = list(itertools.islice(newest_first, self.window))
        if not window:
            return
        avg_in = sum(s.prompt_tokens for s in window) / len(window)
        avg_out = sum(s.max_tokens for s in window) / len(window)
        capacity = max_capacity_batch_size(self.num_blocks, avg_in, avg_out, self.tokens_per_block)
        if self.tune_batch_size:
            self.batch_size = runtime_batch_size(capacity)
            sched.batch_size = min(self.max_batch_size, self.batch_size or self.max_batch_size)
        if self.tune_num_tokens:
            self.num_tokens = runtime_max_num_tokens(sched.batch_size, avg_in, avg_out)
            sched.max_num_tokens = min(self.max_num_tokens, self.num_tokens or self.max_num_tokens)
