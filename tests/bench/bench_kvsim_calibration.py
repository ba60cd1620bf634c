"""kvsim against NVIDIA's published trtllm-bench throughput: the error per row (fitted H100 rows + held-out rows).

Run: ``python -m tests.bench.bench_kvsim_calibration``.
"""

from __future__ import annotations

import time

from kvsim.calibration import H100_8B_FP8, HELD_OUT, evaluate, format_rows


def main() -> None:
    started = time.process_time()
    print("fitted rows: Llama-3.1-8B FP8, 1x H100 (NVIDIA perf-overview.md @ 00f37686)")
    print(format_rows(evaluate("llama-3.1-8b-fp8-h100", H100_8B_FP8)))
    for profile, table in HELD_OUT.items():
        print(f"\nheld out (not fitted): {profile}")
        print(format_rows(evaluate(profile, table)))
    print(f"\n({time.process_time() - started:.1f} CPU-s)")


if __name__ == "__main__":
    main()
