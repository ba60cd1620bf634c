"""Latency percentiles, throughput and SLO goodput of a set of request records.

Goodput follows AIPerf's definition ("completed requests per second that meet specified metric constraints"):
a request counts if it finished with TTFT <= the TTFT SLO and TPOT <= the TPOT SLO; rejected and unfinished
requests are misses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .request import RequestRecord, measured

PERCENTILES = (50, 90, 95, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    data = sorted(v * scale for v in values)
    out = {"mean": sum(data) / len(data) if data else math.nan}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(data, q)
    out["max"] = data[-1] if data else math.nan
    return out


def summarize(records: Sequence[RequestRecord], slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, duration_s: float | None = None) -> dict:
    """Summary of ``records``. ``duration_s`` defaults to first arrival -> last finish."""
    finished = [r for r in records if r.finished]
    if duration_s is None:
        start = min((r.arrival_s for r in records), default=0.0)
        end = max((measured(r.finish_s, "finish_s") for r in finished), default=start)
        duration_s = max(end - start, 1e-9)
    ttft_ok = (lambda r: True) if slo_ttft_ms is None else (lambda r: measured(r.ttft_s, "ttft_s") * 1e3 <= slo_ttft_ms)
    tpot_ok = (lambda r: True) if slo_tpot_ms is None else (lambda r: measured(r.tpot_s, "tpot_s") * 1e3 <= slo_tpot_ms)
    good = sum(1 for r in finished if ttft_ok(r) and tpot_ok(r))
    output_tokens = sum(r.output_tokens for r in finished)
    return {
        "requests": len(records),
        "finished": len(finished),
        "rejected": sum(1 for r in records if r.error is not None),
        "unfinished": sum(1 for r in records if r.error is None and r.finish_s is None),
        "durationS": duration_s,
        "ttftMs": distribution((measured(r.ttft_s, "ttft_s") for r in finished), 1e3),
        "tpotMs": distribution((measured(r.tpot_s, "tpot_s") for r in finished), 1e3),
        "e2eMs": distribution((measured(r.e2e_s, "e2e_s") for r in finished), 1e3),
        "outputTokensPerSecond": output_tokens / duration_s,
        "requestsPerSecond": len(finished) / duration_s,
        "goodputRequestsPerSecond": good / duration_s,
        "sloAttainment": good / len(records) if records else math.nan,
        "slo": {"ttftMs": slo_ttft_ms, "tpotMs": slo_tpot_ms},
        "pausedRequests": sum(1 for r in records if r.num_pauses),
        "pauses": sum(r.num_pauses for r in records),
        "reusedBlocks": sum(r.reused_blocks for r in records),
    }
