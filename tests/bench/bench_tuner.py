"""Benchmark: the autotuner against static max_batch_size settings on every bundled kvsim workload.

Prints, per workload, the goodput (requests/s meeting TTFT <= 2 s and TPOT <= 50 ms) of the blog's
static 64, TensorRT-LLM's defaults, the best static value found by sweeping, and the autotuner (which
starts at 64), with the ratios the project's targets are stated in. Run: python -m tests.bench.bench_tuner
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvsim.workload import bundled_workloads

from kvpilot.bench import tuner

PROFILE = "llama-3.1-8b-fp8-h100"


def main() -> int:
    rows = []
    for name in bundled_workloads():
        args = argparse.Namespace(workload=name, profile=PROFILE, slo_ttft_ms=2000.0, slo_tpot_ms=50.0, replicas=2,
                                  restart_seconds=90.0, ceiling=2048, duration_seconds=None, rate_scale=1.0,
                                  json=True)
        started = time.process_time()
        out = tuner.evaluate(args)
        out["cpuSeconds"] = round(time.process_time() - started, 1)
        rows.append(out)
    print(f"{'workload':16} {'static64':>9} {'trtllm':>9} {'oracle':>14} {'autotuned':>10} {'a/oracle':>9} "
          f"{'a/64':>6} {'oracle/64':>9} {'changes':>7} {'cpu s':>6}")
    for r in rows:
        print(f"{r['workload']:16} {r['seedDefault']['goodput']:9.2f} {r['trtllmDefault']['goodput']:9.2f} "
              f"{r['oracle']['goodput']:8.2f} ({r['oracle']['maxBatchSize']:4d}) {r['autotuned']['goodput']:10.2f} "
              f"{r['ratios']['autotunedOverOracle']:9.3f} {r['ratios']['autotunedOverSeed']:6.2f} "
              f"{r['ratios']['oracleOverSeed']:9.2f} {r['autotuned']['changes']:7d} {r['cpuSeconds']:6.1f}")
    json.dump(rows, sys.stderr if "--json" not in sys.argv else sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
