"""kvsim: a calibrated simulator of TensorRT-LLM's in-flight batching and paged KV cache.

Stable Python API (the operator's tests and the autotuner benchmark build on it; keep it):

    from kvsim import (Profile, PROFILES, get_profile, EngineConfig, CapacityPolicy, KvCacheType,
                       Engine, Request, RequestRecord, RequestRejected)

    engine = Engine(EngineConfig(profile="llama-3.1-8b-fp8-h100", build_max_batch_size=2048,
                                 max_batch_size=256, capacity_policy="GUARANTEED_NO_EVICT"))
    record = engine.submit(Request(prompt_tokens=1000, output_tokens=200, max_tokens=1024), now_s=0.0)
    engine.advance_to(10.0)                 # run every iteration that starts before t = 10 s (simulated)
    engine.drain_iteration_stats()          # trtllm-serve /metrics objects, drained on read, bounded buffer
    engine.finished_requests()              # RequestRecord: arrival_s, first_token_s, finish_s, output_tokens,
                                            #   ttft_s, tpot_s, e2e_s, num_pauses, reused_blocks, error
    engine.counts()                         # queued / active / running / waitingForCapacity / paused / totals
    engine.outstanding()                    # queued + active, without building the counts (a balancer's load)
    Engine(config, iteration_stats=False)   # builds no iteration stats: the same run, for a caller that reads
                                            #   only the requests' records (the tuner's what-if, static runs)

Profiles are named ``<model>-<dtype>-<gpu>[-tpN]``; GPU and model facts come from specs, and one calibrated
parameter set (fitted to NVIDIA's H100 Llama-3.1-8B FP8 table) serves them all.

``EngineConfig``: build ceiling (``build_max_batch_size``, ``build_max_num_tokens``, ``max_seq_len``,
``max_input_len``, ``tokens_per_block``, ``kv_cache_type`` paged|continuous), runtime limits (``max_batch_size``,
``max_num_tokens``; ``None`` = the build value, larger is refused like TensorRT-LLM), ``capacity_policy``
(GUARANTEED_NO_EVICT | MAX_UTILIZATION | STATIC_BATCH), ``free_gpu_memory_fraction``, ``kv_max_tokens``,
``enable_block_reuse``, ``enable_chunked_context``, ``enable_batch_size_tuning`` (TensorRT-LLM's in-engine
dynamic batch tuner; trtllm-serve turns it on), ``enable_max_num_tokens_tuning``, ``iter_stats_max_iterations``,
``backend`` (``tensorrt`` | ``pytorch``: the PyTorch backend's KV pool, iteration stats and CUDA graphs) and
``cuda_graphs`` (``kvsim.cuda_graphs.CudaGraphs``, PyTorch only; None turns graphs off).
``kvsim.perturb.Perturbation(decode=, prefill=, overhead=, per_seq=, memory=).apply(profile)``: a perturbed engine.
The KV pool is sized from GPU memory minus weights minus activation memory (which grows with the BUILD
max_batch_size / max_num_tokens), times the fraction.

Speed: runs of identical decode iterations are collapsed into one step (exact closed-form time). Such a step
emits ONE iteration-stats sample: ``iter`` is the number of the run's last iteration, ``iterLatencyMS`` the
mean per-iteration latency of the run, everything else is as of the end of the run.

Workloads, runs and reports:

    from kvsim import load_workload, summarize, run_workload
    requests = load_workload("chat").requests(duration_s=3600)   # deterministic by the YAML's seed
    result = run_workload(EngineConfig(...), requests)           # RunResult: records, timeline, engine
    summarize(result.records, slo_ttft_ms=2000, slo_tpot_ms=50, duration_s=3600)
"""

from __future__ import annotations

from .config import Backend, CapacityPolicy, EngineConfig, KvCacheType
from .engine import Engine
from .profiles import PROFILES, Calibration, Profile, get_profile
from .request import Request, RequestRecord, RequestRejected
from .runner import RunResult, run_workload, sweep
from .summary import summarize
from .workload import Workload, WorkloadError, load_workload

__all__ = [
    "Backend", "CapacityPolicy", "Calibration", "Engine", "EngineConfig", "KvCacheType", "PROFILES", "Profile", "Request",
    "RequestRecord", "RequestRejected", "RunResult", "Workload", "WorkloadError", "get_profile", "load_workload",
    "run_workload", "summarize", "sweep",
]
__version__ = "0.1.0"
