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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime

from kvpilot import telemetry
from kvpilot.api.models import InferenceEngine, InferenceEngineSpec
from kvpilot.api.status import BatchingStatus
from kvpilot.autotune.calibrate import IterationSample, PromptWork
from kvpilot.autotune.engine_model import base_model
from kvpilot.autotune.gate import (
    CPU_SECONDS_PER_HOUR,
    EngineKey,
    WhatIfBudget,
    WhatIfGate,
    goodput_check,
    may_simulate,
    model_check,
)
from kvpilot.autotune.signals import limit_in_force
from kvpilot.autotune.trust import ModelMonitor
from kvpilot.autotune.whatif import unplaceable
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


def _places(engine: InferenceEngine, observed: Observed) -> bool:
    """Whether kvsim's memory plan places the limit in force on the engine's model (a calibrated memory a capped
    or mislabelled pool sized wrong may not): a model that cannot is no model this pass, so the rules take their
    own branches, not those that count on a simulation to vet them (model_check says why and logs it)."""
    w = observed.kv
    model = what_if_model(engine.spec, _ceiling(engine, observed), observed) if w is not None else None
    if model is None or w is None:
        return True
    limit = limit_in_force(w, _in_force(engine, observed), engine.spec.build.pipeline_parallel_size)
    return limit <= 0 or unplaceable(model, min(limit, model.ceiling)) is None


class Planner:
    """Plans for the operator's loops: inline, or in the what-if worker under the engine's CPU budget. Owns the
    gate's state: each engine's CPU budget and each engine's model (``ModelMonitor``, autotune/trust.py: the fit
    of its pods, fed by ``observe_pods``; the bench feeds it the same way)."""

    def __init__(self, cpu_seconds_per_hour: float = CPU_SECONDS_PER_HOUR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = WhatIfBudget(cpu_seconds_per_hour, clock)
        self.models = ModelRegistry()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpilot-whatif")

    def charge(self, key: EngineKey, cpu_seconds: float) -> None:
        self.budget.charge(key, cpu_seconds)
        telemetry.WHAT_IF_CPU_SECONDS.observe(cpu_seconds)

    def forget(self, key: EngineKey) -> None:
        self.budget.forget(key)
        self.models.forget(key)

    def observe_pods(self, engine: InferenceEngine, samples_by_pod: Mapping[str, Sequence[IterationSample]],
                     context_by_pod: Mapping[str, PromptWork] | None, now_s: float, limit: int) -> None:
        """One window of the engine's pods' iteration stats (each sample once) into its model's fit."""
        if engine.spec.autotune.enabled and any(samples_by_pod.values()):
            self.models.monitor(_key(engine), engine.spec).observe(samples_by_pod, now_s, limit, context_by_pod)

    def with_model(self, engine: InferenceEngine, observed: Observed) -> Observed:
        """``observed`` with the engine's model as its fit leaves it (None before any iteration was seen)."""
        monitor = self.models.get(_key(engine)) if engine.spec.autotune.enabled else None
        return observed if monitor is None else replace(observed, model=monitor.view(monitor.fitted_at))

    def plan_inline(self, engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime) -> Plan:
        """``plan`` on the caller's thread and without the CPU budget: the benchmark, whose time is simulated."""
        observed = self.with_model(engine, observed)
        if not may_simulate(engine.spec, observed.kv, observed.model):
            return plan(engine, observed, settings, now, what_if=WhatIfGate(measured_only=_measured_only(observed)))
        return self.plan_checked(engine, observed, settings, now)

    async def plan(self, engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime) -> Plan:
        observed = self.with_model(engine, observed)
        measured_only = _measured_only(observed)
        if not may_simulate(engine.spec, observed.kv, observed.model):
            return plan(engine, observed, settings, now, what_if=WhatIfGate(measured_only=measured_only))
        key = _key(engine)
        if not self.budget.left(key):
            return plan(engine, observed, settings, now, what_if=WhatIfGate(budget_left=False,
                                                                             measured_only=measured_only))

        def timed() -> tuple[Plan, float]:
            started = time.thread_time()
            out = self.plan_checked(engine, observed, settings, now)
            return out, time.thread_time() - started

        p, cpu = await asyncio.get_running_loop().run_in_executor(self._worker, timed)
        self.charge(key, cpu)
        return p

    def plan_checked(self, engine: InferenceEngine, observed: Observed, settings: Settings, now: datetime) -> Plan:
        """The plan with the model checked first (the worker's job; the bench calls it inline): its goodput at
        the limit in force against the pods' (shown in status, autotune/trust.py; once a minute at most, and when
        the limit moved: ``ModelMonitor.goodput_check_due``, since that simulation was most of a decision's CPU);
        a calibrated model is then judged by its trust verdict, the datasheet by whether it reproduces the misses
        the pods show (``model_reproduces``)."""
        monitor = self.models.get(_key(engine))
        if monitor is not None and observed.kv is not None:
            model = what_if_model(engine.spec, _ceiling(engine, observed), observed)
            rendered = _in_force(engine, observed)  # not the in-engine tuner's cap, which moves every window
            limit = limit_in_force(observed.kv, rendered, engine.spec.build.pipeline_parallel_size)
            if model is not None and monitor.goodput_check_due(now.timestamp(), rendered):
                monitor.note_goodput_error(goodput_check(model, observed.kv, limit), now.timestamp(), rendered)
                observed = replace(observed, model=monitor.view(monitor.fitted_at))
        # A calibrated model is judged by its trust verdict (measured_only); the datasheet (no fit yet, or none
        # possible) still by whether it reproduces the pods' misses.
        measured_only = _measured_only(observed)
        calibrated = observed.model is not None and observed.model.fit is not None and _places(engine, observed)
        gate = WhatIfGate(model_valid=measured_only or calibrated or model_reproduces(engine, observed),
                          measured_only=measured_only, calibrated=calibrated and not measured_only)
        return plan(engine, observed, settings, now, what_if=gate)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


class ModelRegistry:
    """Each engine's model (``ModelMonitor``), made on its first window and made again when the profile it starts
    from changes (another GPU, model or precision in the spec)."""

    def __init__(self) -> None:
        self._monitors: dict[EngineKey, ModelMonitor] = {}

    def get(self, key: EngineKey) -> ModelMonitor | None:
        return self._monitors.get(key)

    def monitor(self, key: EngineKey, spec: InferenceEngineSpec) -> ModelMonitor:
        base = base_model(spec)
        found = self._monitors.get(key)
        if found is None or found.base != base or found.fit.max_num_tokens != spec.batching.max_num_tokens:
            found = self._monitors[key] = ModelMonitor(base, max_num_tokens=spec.batching.max_num_tokens)
        return found

    def forget(self, key: EngineKey) -> None:
        self._monitors.pop(key, None)


def _measured_only(observed: Observed) -> bool:
    return observed.model is not None and observed.model.measured_only


def _key(engine: InferenceEngine) -> EngineKey:
    return (engine.meta.namespace, engine.meta.name)


def _ceiling(engine: InferenceEngine, observed: Observed) -> int:
    ceiling = observed.status.engine.max_batch_size if observed.status.engine is not None else None
    return ceiling if isinstance(ceiling, int) and ceiling > 0 else engine.spec.build.max_batch_size


def _in_force(engine: InferenceEngine, observed: Observed) -> int:
    """The runtime limit the pods run (status.batching), where the pods do not say (PyTorch reports 0)."""
    value = (observed.status.batching or BatchingStatus()).max_batch_size
    return value if isinstance(value, int) and value > 0 else engine.spec.batching.max_batch_size
