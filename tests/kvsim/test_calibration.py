"""Calibration: the simulator against NVIDIA's published trtllm-bench throughput (perf-overview.md @ 00f37686).

Run with ``pytest -s`` to see the error per row. The acceptance criterion is a median absolute error of at most
10% on the ten H100 rows (the rows the four parameters were fitted to); the held-out rows are printed to show
how the one parameter set transfers to H200 and to 70B, and are not asserted.
"""

from __future__ import annotations

from kvsim.bench import trtllm_bench_limits
from kvsim.calibration import H100_8B_FP8, HELD_OUT, evaluate, format_rows, median_abs_error
from kvsim.profiles import get_profile


def test_h100_rows_within_ten_percent_median():
    rows = evaluate("llama-3.1-8b-fp8-h100", H100_8B_FP8)
    print("\n" + format_rows(rows))
    assert len(rows) == 10
    assert median_abs_error(rows) <= 0.10


def test_held_out_rows_are_reported():
    for profile, table in HELD_OUT.items():
        rows = evaluate(profile, table, request_scale=0.5)
        print("\nheld out (half NVIDIA's request counts)\n" + format_rows(rows))
        assert all(r.simulated > 0 for r in rows)


def test_bench_limits_follow_trtllm_bench_heuristic():
    profile = get_profile("llama-3.1-8b-fp8-h100")
    # simulator-calibration.md 7.3 computed these with trtllm-bench's tuning.py formulas
    assert trtllm_bench_limits(profile, 1000, 1000) == (640, 2048)
    assert trtllm_bench_limits(profile, 161, 338) == (2304, 3328)
    assert trtllm_bench_limits(profile, 1155, 211)[0] == 896
