"""A ``trtllm-bench throughput``-style saturated benchmark on the simulator.

Like trtllm-bench: every request (fixed ISL/OSL, random tokens so no prefix reuse) is queued at t=0, the
engine's limits come from trtllm-bench's own heuristic (tensorrt_llm/bench/build/tuning.py: KV capacity from
(memory - engine size) x 0.95 over the target sequence length, max batch size rounded up "slightly
optimistically", max_num_tokens = bs x (1 + ISL/OSL) within [2048, 32768]), the KV fraction is 0.95 (as
NVIDIA's perf runs use), and the figure is total output tokens over the wall time of the whole run.
Chunked context is on, as trtllm-bench's ``--enable_chunked_context`` defaults (benchmark/throughput.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import CapacityPolicy, EngineConfig
from .engine import Engine
from .profiles import Profile, get_profile
from .request import Request, measured

GIB = 1 << 30

# $num_requests per ISL/OSL used for NVIDIA's perf-overview table (perf-overview.md @ 00f37686).
NVIDIA_NUM_REQUESTS = {
    (128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500, (2048, 128): 3000,
    (2048, 2048): 1500, (5000, 500): 1500, (1000, 1000): 3000, (500, 2000): 3000, (20000, 2000): 1000,
}


def trtllm_bench_limits(profile: Profile, isl: int, osl: int, kv_fraction: float = 0.95) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) the way trtllm-bench's ``calc_engine_setting`` picks them."""
    m = profile.model
    bytes_per_elem = 1.0 if profile.quant_algo == "FP8" else 2.0
    bytes_per_kv = profile.kv_bytes_per_elem
    kv_heads = max(profile.tp, m.num_kv_heads)
    gib_per_token = 2 * m.num_layers * kv_heads * m.head_dim * bytes_per_kv / GIB
    engine_gib = m.total_params * bytes_per_elem / GIB
    total_gib = profile.gpu.memory_bytes / GIB * profile.num_gpus
    cache_gib = (total_gib - engine_gib) * kv_fraction
    kv_max_requests = cache_gib / (gib_per_token * (isl + osl))
    raw_bs = min(kv_max_requests, 4096) / profile.pp
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        max_bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        max_bs = 128 * math.ceil(raw_bs / 128)
    else:
        max_bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        max_tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        max_tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        max_tokens = 1024 * math.ceil(raw_tokens / 1024)
    return max_bs, max_tokens


@dataclass(frozen=True)
class BenchResult:
    profile: str
    isl: int
    osl: int
    num_requests: int
    max_batch_size: int
    max_num_tokens: int
    kv_blocks: int
    duration_s: float
    output_tokens_per_s: float
    request_per_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    max_concurrency: int
    iterations: int

    def as_json(self) -> dict:
        return {
            "profile": self.profile, "isl": self.isl, "osl": self.osl, "numRequests": self.num_requests,
            "maxBatchSize": self.max_batch_size, "maxNumTokens": self.max_num_tokens, "kvBlocks": self.kv_blocks,
            "durationS": self.duration_s, "outputTokensPerSecond": self.output_tokens_per_s,
            "requestsPerSecond": self.request_per_s, "meanTtftMs": self.mean_ttft_s * 1e3,
            "meanTpotMs": self.mean_tpot_s * 1e3, "maxConcurrency": self.max_concurrency,
            "iterations": self.iterations,
        }


def bench_throughput(profile: Profile | str, isl: int, osl: int, num_requests: int | None = None,
                     kv_fraction: float = 0.95, max_batch_size: int | None = None,
                     max_num_tokens: int | None = None,
                     policy: CapacityPolicy = CapacityPolicy.GUARANTEED_NO_EVICT,
                     chunked_context: bool = True) -> BenchResult:
    """Saturated output throughput for fixed ISL/OSL (NVIDIA's request count for the pair by default)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    bs, tokens = trtllm_bench_limits(prof, isl, osl, kv_fraction)
    bs, tokens = max_batch_size or bs, max_num_tokens or tokens
    n = num_requests or NVIDIA_NUM_REQUESTS.get((isl, osl), 1000)
    config = EngineConfig(profile=prof, build_max_batch_size=bs, build_max_num_tokens=tokens,
                          max_seq_len=isl + osl, max_input_len=isl, free_gpu_memory_fraction=kv_fraction,
                          enable_block_reuse=False, enable_chunked_context=chunked_context or isl > tokens, capacity_policy=policy,
                          iter_stats_max_iterations=1)
    engine = Engine(config, epoch_s=0.0)
    for i in range(n):
        engine.submit(Request(prompt_tokens=isl, output_tokens=osl, max_tokens=osl, arrival_s=0.0, request_id=i))
    max_concurrency = 0
    while not engine.idle:
        engine.advance_to(engine.now + 1.0)
        max_concurrency = max(max_concurrency, engine.counts()["running"])
    records = engine.finished_requests()
    duration = max(measured(r.finish_s, "finish_s") for r in records)
    total_out = sum(r.output_tokens for r in records)
    return BenchResult(
        profile=prof.name, isl=isl, osl=osl, num_requests=n, max_batch_size=bs, max_num_tokens=tokens,
        kv_blocks=engine.memory.num_blocks, duration_s=duration, output_tokens_per_s=total_out / duration,
        request_per_s=n / duration, mean_ttft_s=sum(measured(r.ttft_s, "ttft_s") for r in records) / n,
        mean_tpot_s=sum(measured(r.tpot_s, "tpot_s") for r in records) / n, max_concurrency=max_concurrency,
        iterations=engine.iteration,
    )
