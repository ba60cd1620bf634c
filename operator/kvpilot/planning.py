"""Runs a reconcile's plan off the event loop when the autotuner may simulate, within a CPU budget per engine.

``desired.plan`` is pure and takes microseconds, except when the autotuner asks kvsim "what if" (a few
simulated minutes of traffic per candidate limit: up to a few CPU-seconds, autotune/whatif.py). Run on the
event loop, that would stall every other engine's reconciles, scrapes and watch events. So a plan that may
simulate runs in one dedicated worker thread (one simulation at a time for the whole operator), and each
engine has a budget of CPU seconds per hour for it (autotune/gate.py, ``WhatIfBudget``): once spent, its plans
run inline with the simulation off, and the tuner holds the changes the simulation would have had to confirm
(reason ``WhatIfBudgetSpent``). The worker shares the GIL with the event loop, which still runs between the
interpreter's switch intervals (5 ms); the budget bounds the share of the CPU the simulation takes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from kvpilot import telemetry
from kvpilot.api.models import InferenceEngine
from kvpilot.autotune.gate import CPU_SECONDS_PER_HOUR, EngineKey, WhatIfBudget, WhatIfGate, may_simulate, model_check
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import Plan, plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.tuning import what_if_model

log = logging.getLogger(__name__)


def model_reproduces(engine: InferenceEngine, observed: Observed) -> bool:
    """Whether kvsim, fed the fitted traffic at the limit in force, shows the misses the pods show (the gate's
    model check, autotune/gate.model_check, on the model at the ceiling status records). Runs in the worker."""
    w = observed.kv
    if w is None:
        return True
    ceiling = observed.status.engine.max_batch_size if observed.status.engine is not None else None
    model = what_if_model(engine.spec, ceiling if isinstance(ceiling, int) and ceiling > 0
                          else engine.spec.build.max_batch_size, observed)
    rendered = observed.status.batching.max_batch_size if observed.status.batching is not None else None
    why = model_check(model, w, rendered=rendered if isinstance(rendered, int) and rendered > 0 else 0,
                      pipeline_parallel=engine.spec.build.pipeline_parallel_size) if model is not None else None
    if why is None:
        return True
    log.info("InferenceEngine %s/%s: staying put, %s: the tuner's rules decide alone",
             engine.meta.namespace, engine.meta.name, why)
    return False


class Planner:
    """Plans for the operator's loops: inline, or in the what-if worker under the engine's CPU budget."""

    def __init__(self, cpu_seconds_per_hour: float = CPU_SECONDS_PER_HOUR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = WhatIfBudget(cpu_seconds_per_hour, clock)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpilot-whatif")

    def charge(self, key: EngineKey, cpu_seconds: float) -> None:
        self.budget.charge(key, cpu_seconds)
        telemetry.WHAT_IF_CPU_SECONDS.observe(cpu_seconds)

    def forget(self, key: EngineKey) -> None:
        self.budget.forget(key)

    async def plan(self, engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime) -> Plan:
        if not may_simulate(engine.spec, observed.kv):
            return plan(engine, observed, settings, now)
        key = (engine.meta.namespace, engine.meta.name)
        if not self.budget.left(key):
            return plan(engine, observed, settings, now, what_if=WhatIfGate(budget_left=False))

        def timed() -> tuple[Plan, float]:
            started = time.thread_time()
            gate = WhatIfGate(model_valid=model_reproduces(engine, observed))
            out = plan(engine, observed, settings, now, what_if=gate)
            return out, time.thread_time() - started

        p, cpu = await asyncio.get_running_loop().run_in_executor(self._worker, timed)
        self.charge(key, cpu)
        return p

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
