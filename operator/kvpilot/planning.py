"""Runs a reconcile's plan off the event loop when the autotuner may simulate, within a CPU budget per engine.

``desired.plan`` is pure and takes microseconds, except when the autotuner asks kvsim "what if" (a few
simulated minutes of traffic per candidate limit: up to a few CPU-seconds, autotune/whatif.py). Run on the
event loop, that would stall every other engine's reconciles, scrapes and watch events. So a plan that may
simulate runs in one dedicated worker thread (one simulation at a time for the whole operator), and each
engine has a budget of CPU seconds per hour for it: once spent, its plans run inline with the simulation off,
and the tuner holds the changes the simulation would have had to confirm (desired/plan.py, reason
``WhatIfBudgetSpent``). The worker shares the GIL with the event loop, which still runs between the
interpreter's switch intervals (5 ms); the budget bounds the share of the CPU the simulation takes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime

from kvpilot import telemetry
from kvpilot.api.models import InferenceEngine
from kvpilot.autotune.whatif import fit_traffic, quantized, steady_goodput
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import Plan, Settings, _what_if, plan

WHAT_IF_CPU_SECONDS_PER_HOUR = 120.0  # per engine: ~3% of one core at most, averaged over an hour
BUDGET_WINDOW_SECONDS = 3600.0
# The model must reproduce the present: where at least this share of requests missed an objective, staying put
# simulated must not serve nearly all the traffic (MODEL_ALL_SERVED of it) within the objectives.
MODEL_CHECK_MISSES = 0.10
MODEL_ALL_SERVED = 0.9
log = logging.getLogger(__name__)


def model_reproduces(engine: InferenceEngine, observed: Observed) -> bool:
    """Whether kvsim, fed the fitted traffic at the limit in force, shows the misses the pods show.

    The what-if trusts the model to rank the candidates; where the pods miss their objectives while the model,
    staying put, serves nearly all the traffic within them (pods slower than their profile: another GPU clock,
    a starved host for simulated pods), its "nothing to gain" is wrong, so the rules decide alone. In a true
    overload the model misses too and stays in charge. Runs one simulation (memoized), in the worker."""
    w = observed.kv
    if w is None:
        return True
    if w.ttft_miss_fraction is None and w.tpot_miss_fraction is None:
        # No latency histograms (1.2's TensorRT backend serves no Prometheus page): requests waiting beside a full
        # batch are the evidence the rules act on.
        waiting = w.mean_queued >= 1 and w.runtime_batch_size > 0 and w.peak_active >= w.runtime_batch_size
        misses = 1.0 if waiting else 0.0
    else:
        misses = max(w.ttft_miss_fraction or 0.0, w.tpot_miss_fraction or 0.0)
    if misses < MODEL_CHECK_MISSES or w.completion_rate <= 0 or w.runtime_batch_size <= 0:
        return True
    fit = fit_traffic(w)
    ceiling = observed.status.engine.max_batch_size if observed.status.engine is not None else None
    model = _what_if(engine.spec, ceiling if isinstance(ceiling, int) and ceiling > 0
                     else engine.spec.build.max_batch_size, observed)
    if fit is None or model is None:
        return True
    fit = quantized(fit)
    simulated = steady_goodput(model, fit, min(w.runtime_batch_size, model.ceiling))
    if simulated < MODEL_ALL_SERVED * fit.rate_per_s:
        return True  # the model sees the misses too (overload): it can rank the candidates
    log.info("InferenceEngine %s/%s: staying put, the what-if model serves %.2f of %.2f req/s within the objectives "
             "where the pods missed them (or queued beside a full batch): the tuner's rules decide alone",
             engine.meta.namespace, engine.meta.name, simulated, fit.rate_per_s)
    return False


def may_simulate(engine: InferenceEngine, observed: Observed) -> bool:
    """Whether this pass's autotune decision may run the what-if: tuning on, a kvsim profile to simulate
    (the simulated backend names one), and a window with the traffic fitted (autotune/whatif.fit_traffic)."""
    spec, kv = engine.spec, observed.kv
    sim = spec.runtime.simulation
    return bool(spec.autotune.enabled and spec.runtime.backend == "simulated" and sim is not None and sim.profile
                and kv is not None and kv.arrival_rate > 0 and kv.prompt_mean > 0 and kv.output_mean > 0)


class Planner:
    """Plans for the operator's loops: inline, or in the what-if worker under the engine's CPU budget."""

    def __init__(self, cpu_seconds_per_hour: float = WHAT_IF_CPU_SECONDS_PER_HOUR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cpu_seconds_per_hour = cpu_seconds_per_hour
        self.clock = clock
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpilot-whatif")
        self._spent: dict[tuple[str, str], deque[tuple[float, float]]] = {}  # engine -> (at, CPU seconds)

    def spent(self, key: tuple[str, str]) -> float:
        """CPU seconds this engine's what-if plans took in the last hour."""
        runs = self._spent.get(key)
        if not runs:
            return 0.0
        horizon = self.clock() - BUDGET_WINDOW_SECONDS
        while runs and runs[0][0] < horizon:
            runs.popleft()
        return sum(cpu for _, cpu in runs)

    def charge(self, key: tuple[str, str], cpu_seconds: float) -> None:
        self._spent.setdefault(key, deque()).append((self.clock(), cpu_seconds))
        telemetry.WHAT_IF_CPU_SECONDS.observe(cpu_seconds)

    def forget(self, key: tuple[str, str]) -> None:
        self._spent.pop(key, None)

    async def plan(self, engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime) -> Plan:
        if not may_simulate(engine, observed):
            return plan(engine, observed, settings, now)
        key = (engine.meta.namespace, engine.meta.name)
        if self.spent(key) >= self.cpu_seconds_per_hour:
            return plan(engine, replace(observed, what_if_allowed=False), settings, now)

        def timed() -> tuple[Plan, float]:
            started = time.thread_time()
            checked = observed if model_reproduces(engine, observed) else replace(observed, what_if_model_valid=False)
            out = plan(engine, checked, settings, now)
            return out, time.thread_time() - started

        p, cpu = await asyncio.get_running_loop().run_in_executor(self._worker, timed)
        self.charge(key, cpu)
        return p

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
