"""Run a request stream through an engine, and sweep engine settings; the data behind ``kvsim run``/``sweep``."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from .config import EngineConfig
from .engine import Engine
from .request import Request, RequestRecord, RequestRejected
from .stats import TimelinePoint
from .summary import summarize


@dataclass
class RunResult:
    config: EngineConfig
    records: list[RequestRecord]
    timeline: list[TimelinePoint]
    engine: Engine
    cpu_s: float
    horizon_reached: bool

    def summary(self, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                duration_s: float | None = None) -> dict:
        out = summarize(self.records, slo_ttft_ms, slo_tpot_ms, duration_s)
        out["kvBlocks"] = self.engine.memory.num_blocks
        out["kvTokens"] = self.engine.memory.kv_tokens
        util = [p.kv_utilization for p in self.timeline]
        out["kvUtilization"] = {"mean": sum(util) / len(util) if util else math.nan,
                                "max": max(util, default=math.nan)}
        out["iterations"] = self.engine.iteration
        out["simulatedS"] = self.engine.now
        out["cpuS"] = self.cpu_s
        return out


def run_workload(config: EngineConfig, requests: list[Request], timeline_interval_s: float | None = 1.0,
                 horizon_s: float | None = None) -> RunResult:
    """Simulate ``requests``; stop at ``horizon_s`` if given (requests still running count as unfinished).
    ``timeline_interval_s``: how often to sample the timeline (None: no timeline, faster)."""
    started = time.process_time()
    engine = Engine(config, epoch_s=0.0, timeline_interval_s=timeline_interval_s)
    records: list[RequestRecord] = []
    for request in requests:
        try:
            records.append(engine.submit(request))
        except RequestRejected as exc:
            max_tokens = request.max_tokens or request.output_tokens
            records.append(RequestRecord(request.request_id, request.arrival_s, request.prompt_tokens, max_tokens,
                                         request.output_tokens, error=str(exc)))
    engine.advance_to(math.inf if horizon_s is None else horizon_s)
    return RunResult(engine.config, records, engine.timeline, engine, time.process_time() - started,
                     horizon_s is not None and not engine.idle)


def sweep(base: EngineConfig, requests: list[Request], grid: dict[str, list[Any]],
          slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
          horizon_s: float | None = None) -> list[dict]:
    """Every combination of ``grid`` (EngineConfig field -> values) on the same requests."""
    names = list(grid)
    rows = []
    for values in itertools.product(*(grid[n] for n in names)):
        params = dict(zip(names, values))
        if "max_batch_size" in params and "build_max_batch_size" not in params:
            params["build_max_batch_size"] = max(base.build_max_batch_size, params["max_batch_size"])
        config = replace(base, **params)
        result = run_workload(config, requests, horizon_s=horizon_s)
        rows.append({"params": {n: _plain(v) for n, v in zip(names, values)},
                     "summary": result.summary(slo_ttft_ms, slo_tpot_ms)})
    return rows


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)
