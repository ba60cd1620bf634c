"""Iteration statistics in the exact JSON shape of trtllm-serve's ``GET /metrics``, and a time-series sampler.

The engine stores one compact tuple per scheduling step (cheap) and converts to dicts only when drained.
When kvsim collapses a run of identical decode iterations into one step (see ``Engine``), it emits ONE sample
for the run: ``iter`` is the last iteration's number, ``iterLatencyMS`` the mean latency of the run's
iterations, counters are as of the end of the run. A poller therefore sees ``iter`` jump; every other field
keeps TensorRT-LLM's meaning.

On the PyTorch backend the object has ``PyExecutor``'s shape (tensorrt_llm/_torch/pyexecutor/py_executor.py,
``_get_init_iter_stats`` / ``_update_iter_stats``, 1.2-era index ids 4553249729 and 3542389387, the same in the
later id 54965565749): the batch-size and token-limit fields are never set and read 0,
``staticBatchingStats`` is an all-zero object ("not used in pytorch path"), and ``inflightBatchingStats``
carries the scheduled/context/generation/paused counts, ``numCtxTokens`` and ``microBatchId`` with
``avgNumDecodedTokensPerIter`` 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple


class StepSample(NamedTuple):
    end_s: float
    iteration: int
    latency_ms: float
    num_active: int
    num_queued: int
    num_completed: int
    max_num_active: int
    max_bs_static: int
    max_bs_tuner: int
    max_bs_runtime: int
    max_nt_static: int
    max_nt_tuner: int
    max_nt_runtime: int
    gpu_mem: int
    max_blocks: int
    used_blocks: int
    tokens_per_block: int
    alloc_total: int
    alloc_new: int
    reused: int
    missed: int
    num_scheduled: int
    num_ctx: int
    num_gen: int
    num_paused: int
    num_ctx_tokens: int


def format_timestamp(epoch_s: float) -> str:
    """TensorRT-LLM's getCurrentTimestamp(): local ``%m-%d-%Y %H:%M:%S.uuuuuu``."""
    whole = int(epoch_s)
    micros = int(round((epoch_s - whole) * 1e6))
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    return time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(whole)) + f".{micros:06d}"


def sample_to_json(s: StepSample, epoch_offset_s: float, time_scale: float = 1.0, pytorch: bool = False) -> dict:
    """One iteration-stats object with TensorRT-LLM's field names (timestamp = epoch + t / time_scale); the
    PyTorch backend's shape when ``pytorch``."""
    out = _tensorrt_json(s, epoch_offset_s, time_scale)
    if pytorch:
        for key in ("maxBatchSizeStatic", "maxBatchSizeTunerRecommended", "maxBatchSizeRuntime", "maxNumTokensStatic",
                    "maxNumTokensTunerRecommended", "maxNumTokensRuntime"):
            out[key] = 0
        out["inflightBatchingStats"]["avgNumDecodedTokensPerIter"] = 0.0
        out["staticBatchingStats"] = {"numScheduledRequests": 0, "numContextRequests": 0, "numCtxTokens": 0,
                                      "numGenTokens": 0, "emptyGenSlots": 0}
    return out


def _tensorrt_json(s: StepSample, epoch_offset_s: float, time_scale: float) -> dict:
    reused, missed = s.reused, s.missed
    hit_rate = reused / (reused + missed) if reused + missed else 0.0
    return {
        "timestamp": format_timestamp(epoch_offset_s + s.end_s / time_scale),
        "iter": s.iteration,
        "iterLatencyMS": s.latency_ms,
        "newActiveRequestsQueueLatencyMS": 0.0,
        "numNewActiveRequests": 0,
        "numActiveRequests": s.num_active,
        "numQueuedRequests": s.num_queued,
        "numCompletedRequests": s.num_completed,
        "maxNumActiveRequests": s.max_num_active,
        "maxBatchSizeStatic": s.max_bs_static,
        "maxBatchSizeTunerRecommended": s.max_bs_tuner,
        "maxBatchSizeRuntime": s.max_bs_runtime,
        "maxNumTokensStatic": s.max_nt_static,
        "maxNumTokensTunerRecommended": s.max_nt_tuner,
        "maxNumTokensRuntime": s.max_nt_runtime,
        "gpuMemUsage": s.gpu_mem,
        "cpuMemUsage": 0,
        "pinnedMemUsage": 0,
        "kvCacheStats": {
            "maxNumBlocks": s.max_blocks,
            "freeNumBlocks": s.max_blocks - s.used_blocks,
            "usedNumBlocks": s.used_blocks,
            "tokensPerBlock": s.tokens_per_block,
            "allocTotalBlocks": s.alloc_total,
            "allocNewBlocks": s.alloc_new,
            "reusedBlocks": reused,
            "missedBlocks": missed,
            "cacheHitRate": hit_rate,
        },
        "inflightBatchingStats": {
            "numScheduledRequests": s.num_scheduled,
            "numContextRequests": s.num_ctx,
            "numGenRequests": s.num_gen,
            "numPausedRequests": s.num_paused,
            "numCtxTokens": s.num_ctx_tokens,
            "microBatchId": 0,
            "avgNumDecodedTokensPerIter": 1.0 if s.num_gen else 0.0,
        },
    }


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """A periodic snapshot for plots: KV use and request counts at simulated time ``t_s``."""

    t_s: float
    used_blocks: int
    max_blocks: int
    reserved_blocks: int
    kv_tokens: int
    num_active: int
    num_queued: int
    num_running: int
    num_waiting_for_capacity: int
    paused_total: int
    completed_total: int
    max_batch_size_runtime: int

    @property
    def kv_utilization(self) -> float:
        return self.used_blocks / self.max_blocks

    def as_dict(self) -> dict:
        return {
            "tS": self.t_s,
            "usedBlocks": self.used_blocks,
            "maxBlocks": self.max_blocks,
            "reservedBlocks": self.reserved_blocks,
            "kvTokens": self.kv_tokens,
            "kvUtilization": self.kv_utilization,
            "numActive": self.num_active,
            "numQueued": self.num_queued,
            "numRunning": self.num_running,
            "numWaitingForCapacity": self.num_waiting_for_capacity,
            "pausedTotal": self.paused_total,
            "completedTotal": self.completed_total,
            "maxBatchSizeRuntime": self.max_batch_size_runtime,
        }
