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

import math

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
