"""SHA-256 fingerprints of kvsim's results over a fixed set of configurations: ``python -m tests.kvsim.fingerprint``.

Why: a refactoring of the engine must leave every result bit-identical. Each line hashes, for one
configuration and workload, every finished record's times and counts, every iteration-stats object and every
timeline point (floats by ``repr``, so any change in the last bit shows). Run it before and after a change
and compare the lines; a change that is meant to move results (a model fix) says which lines moved and why.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace

from kvsim import Engine, EngineConfig, load_workload
from kvsim.bench import bench_throughput
from kvsim.config import CapacityPolicy, KvCacheType

BASE = EngineConfig(profile="llama-3.1-8b-fp8-h100", build_max_batch_size=512, max_batch_size=256)
CASES: dict[str, tuple[EngineConfig, str, float]] = {
    "gne-chat": (BASE, "chat", 1.0),
    "gne-code-chunked": (replace(BASE, enable_chunked_context=True), "code", 2.0),
    "maxutil-sharegpt": (replace(BASE, capacity_policy=CapacityPolicy.MAX_UTILIZATION, kv_max_tokens=200_000),
                         "sharegpt", 1.0),
    "tuner-chat-surge": (replace(BASE, enable_batch_size_tuning=True), "chat-surge", 1.0),
    "tuner-nt-chunked": (replace(BASE, enable_batch_size_tuning=True, enable_max_num_tokens_tuning=True,
                                 enable_chunked_context=True), "code", 1.0),
    "static-chat": (replace(BASE, capacity_policy=CapacityPolicy.STATIC_BATCH), "chat", 0.5),
    "contiguous-chat": (replace(BASE, kv_cache_type=KvCacheType.CONTINUOUS, max_seq_len=8192), "chat", 1.0),
    "tp4-70b-ramp": (replace(BASE, profile="llama-3.1-70b-fp8-h100-tp4", tokens_per_block=16), "sharegpt-ramp",
                     0.5),
    "l40s-reuse-off": (replace(BASE, profile="llama-3.1-8b-fp8-l40s", enable_block_reuse=False), "chat", 1.0),
}
DURATION_S = 300.0


def fingerprint(config: EngineConfig, workload: str, rate_scale: float) -> str:
    digest = hashlib.sha256()
    engine = Engine(config, epoch_s=0.0, timeline_interval_s=5.0)
    for request in load_workload(workload).requests(DURATION_S, rate_scale, None):
        try:
            engine.submit(request)
        except ValueError as exc:
            digest.update(f"rejected {exc}".encode())
    t = 0.0
    while not engine.idle:
        t += 7.0
        engine.advance_to(t)
        digest.update(json.dumps(engine.drain_iteration_stats(), sort_keys=True).encode())
        digest.update(repr(sorted(engine.counts().items())).encode())
    for r in engine.finished_requests():
        digest.update(repr((r.request_id, r.arrival_s, r.start_s, r.first_token_s, r.finish_s, r.output_tokens,
                            r.num_pauses, r.reused_blocks, r.error)).encode())
    for p in engine.timeline:
        digest.update(repr(p).encode())
    digest.update(repr((engine.memory, engine.iteration, engine.now)).encode())
    return digest.hexdigest()


def bench_fingerprint() -> str:
    rows = [bench_throughput("llama-3.1-8b-fp8-h100", isl, osl, num_requests=400).as_json()
            for isl, osl in ((128, 128), (1000, 1000), (2048, 128))]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def main() -> int:
    for name, (config, workload, rate) in CASES.items():
        print(f"{name:<20} {fingerprint(config, workload, rate)}", flush=True)
    print(f"{'bench-throughput':<20} {bench_fingerprint()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
