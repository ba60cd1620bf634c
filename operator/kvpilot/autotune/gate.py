"""The what-if gate: whether, and on which model, the tuner may simulate a proposed change before making it.

Everything that decides it lives here:

* the **model** (``engine_model``): the kvsim profile calibrated to the pods (autotune/trust.py, ``ModelView``),
  for any engine once fitted, or the profile the simulated backend names; without one the rules decide alone;
* the **model's trust** (``WhatIfGate.measured_only``): where the calibrated model still disagrees with the pods
  by more than the stated bound, nothing is simulated and the rules step conservatively;
* the **traffic** (``may_simulate``): the window must carry a traffic fit (autotune/replay.fit_traffic);
* the **CPU budget** (``WhatIfBudget``): each engine may spend ``CPU_SECONDS_PER_HOUR`` on simulations; once
  spent, the changes the simulation would have had to confirm wait (``WhatIfBudgetSpent``), protective lowers
  excepted;
* the **model check** (``model_check``): the model must reproduce the present, or its "nothing to gain" is not
  to be trusted and the rules decide alone; ``goodput_check`` measures its error at the limit in force for
  status (trust is judged on the latency error: autotune/trust.py);
* the **recheck period** (``WhatIfGate.recheck``): after a decline the simulation reruns only
  ``RECHECK_SECONDS`` later, unless most requests miss.

``WhatIfGate`` is one decision's verdicts (a value, so ``desired.plan.plan`` and the policy stay pure); the
planner (kvpilot/planning.py) reaches them before the plan runs and passes the gate to ``plan()``;
``policy.decide`` applies it. ``WhatIfBudget`` is the gate's only state.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.autotune.constants import SEVERE_MISSES
from kvpilot.api.status import Action
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.signals import limit_in_force, waiting_beside_full_batch
from kvpilot.autotune.trust import ModelView, goodput_error
from kvpilot.autotune.replay import fit_traffic, quantized
from kvpilot.autotune.whatif import SHED_SHARE, Engine, unplaceable, steady_goodput
from kvpilot.autotune.window import KvWindow

# Once the simulation has declined a change the rules proposed, it reruns only this long after (or at once when
# most requests miss): the CPU bound per engine (docs/tuner-suite.md, "How the tuner decides now").
RECHECK_SECONDS = 120.0
CPU_SECONDS_PER_HOUR = 120.0  # per engine: ~3% of one core at most, averaged over an hour
BUDGET_WINDOW_SECONDS = 3600.0
# The model must reproduce the present: where at least this share of requests missed an objective, staying put
# simulated must not serve nearly all the traffic (MODEL_ALL_SERVED of it) within the objectives.
MODEL_CHECK_MISSES = 0.10
MODEL_ALL_SERVED = 0.9

EngineKey = tuple[str, str]  # (namespace, name)


def engine_model(spec: InferenceEngineSpec, ceiling: int, *, restart_seconds: float, surge_pods: int,
                 model: ModelView | None = None) -> Engine | None:
    """The kvsim model of the served engine: with ``model`` (the engine's fit, autotune/trust.py), the profile
    calibrated to its pods, with the model's error (a real engine too, kvsim's profile of it or a template
    once fitted); without, the profile the simulated backend names (None for any other engine: the rules
    decide alone). ``surge_pods``: the pods a rollout starts ahead of the old ones
    (desired/rollout.surge_pods_in_force)."""
    backend = spec.trtllm_backend  # the simulated backend plays runtime.simulation.backend
    sim = spec.runtime.simulation
    named = sim.profile if spec.runtime.backend == "simulated" and sim is not None and sim.profile else None
    profile = model.profile(ceiling, spec.batching.scheduler_policy, backend) if model is not None else named
    error = model.model_error if model is not None else 0.0
    if profile is None:
        return None
    slo = spec.autotune.slo
    ttft = slo.time_to_first_token_millis if slo else None
    return Engine(
        profile=profile, ceiling=ceiling, scheduler_policy=spec.batching.scheduler_policy,
        replicas=spec.serving.replicas, restart_seconds=restart_seconds,
        surge=surge_pods > 0, max_surge=max(1, surge_pods),
        ttft_ms=float(slo.time_to_first_token_millis) if slo and slo.time_to_first_token_millis else math.inf,
        tpot_ms=float(slo.time_per_output_token_millis) if slo and slo.time_per_output_token_millis else math.inf,
        queue_timeout_s=SHED_SHARE * ttft / 1e3 if ttft else None, model_error=error, backend=backend,
        in_engine_tuner=spec.batching.dynamic_batch_size_tuning and backend == "tensorrt")


def at_runtime_cap(model: Engine) -> Engine:
    """``model`` as the checks against the pods simulate it: at the limit the pods ran (signals.limit_in_force: with
    TensorRT-LLM's in-engine tuner, the tuner's cap, ``maxBatchSizeRuntime``), so without the tuner, which would
    cap that cap again. The what-if's verdict simulates the configured limit, with the tuner the pods run."""
    return replace(model, in_engine_tuner=False) if model.in_engine_tuner else model


def may_simulate(spec: InferenceEngineSpec, w: KvWindow | None, model: ModelView | None = None) -> bool:
    """Whether this pass's autotune decision may run the what-if: tuning on, a model to simulate (the simulated
    backend names a kvsim profile, or the engine's fit gives one, ``engine_model``), and a window with the
    traffic fitted (autotune/replay.fit_traffic)."""
    sim = spec.runtime.simulation
    named = spec.runtime.backend == "simulated" and sim is not None and bool(sim.profile)
    fitted = model is not None and (model.fit is not None or model.base.known)
    return bool(spec.autotune.enabled and (named or fitted)
                and w is not None and w.arrival_rate > 0 and w.prompt_mean > 0 and w.output_mean > 0)


def goodput_check(model: Engine, w: KvWindow, limit: int) -> float | None:
    """The model against the pods at the limit in force: kvsim fed the window's traffic, minus the good
    requests the pods served, over the offered traffic (autotune/trust.goodput_error). One simulation,
    memoized; None without a traffic fit or latency histograms."""
    fit = fit_traffic(w)
    if fit is None or limit <= 0 or (w.ttft_miss_fraction is None and w.tpot_miss_fraction is None):
        return None
    try:
        return goodput_error(steady_goodput(at_runtime_cap(model), quantized(fit), min(limit, model.ceiling)), w)
    except ValueError:  # kvsim's memory plan cannot place the limit on the model: model_check says why
        return None


def model_misses(model: Engine, w: KvWindow, limit: int) -> float | None:
    """The share of the window's traffic the model fails to serve within the objectives at ``limit`` (one
    memoized simulation); None without a traffic fit, or where the model cannot place the limit."""
    fit = fit_traffic(w)
    if fit is None or limit <= 0:
        return None
    fit = quantized(fit)
    try:
        served = steady_goodput(model, fit, min(limit, model.ceiling))
    except ValueError:
        return None
    return max(0.0, 1.0 - served / fit.rate_per_s)


def model_check(model: Engine, w: KvWindow, *, rendered: int = 0, pipeline_parallel: int = 1) -> str | None:
    """Why the model does not reproduce what the pods show (None: it does, or there is nothing to check).

    The what-if trusts the model to rank the candidates; where the pods miss their objectives while the model,
    staying put, serves nearly all the traffic within them (pods slower than their profile: another GPU clock,
    a starved host for simulated pods), its "nothing to gain" is wrong, so the rules decide alone. In a true
    overload the model misses too and stays in charge. Runs one simulation (memoized). ``rendered`` and
    ``pipeline_parallel``: the limit kvpilot rendered (status.batching) and the engine's PP, against which the
    limit in force and "batch full" are read where the pods report no batch size (the PyTorch backend:
    signals.limit_in_force, signals.waiting_beside_full_batch)."""
    limit = limit_in_force(w, rendered, pipeline_parallel)
    model = at_runtime_cap(model)
    refused = unplaceable(model, min(limit, model.ceiling)) if limit > 0 else None
    if refused is not None:
        return refused
    if w.ttft_miss_fraction is None and w.tpot_miss_fraction is None:
        # No latency histograms (1.2's TensorRT backend serves no Prometheus page): requests waiting beside a full
        # batch are the evidence the rules act on.
        misses = 1.0 if waiting_beside_full_batch(w, rendered, pipeline_parallel) else 0.0
    else:
        misses = w.miss_share
    if misses < MODEL_CHECK_MISSES or w.completion_rate <= 0 or limit <= 0:
        return None
    fit = fit_traffic(w)
    if fit is None:
        return None
    fit = quantized(fit)
    simulated = steady_goodput(model, fit, min(limit, model.ceiling))  # placeable: checked above
    if simulated < MODEL_ALL_SERVED * fit.rate_per_s:
        return None  # the model sees the misses too (overload): it can rank the candidates
    return (f"the what-if model serves {simulated:.2f} of {fit.rate_per_s:.2f} req/s within the objectives where "
            f"the pods missed them (or queued beside a full batch)")


@dataclass(frozen=True)
class WhatIfGate:
    """One decision's access to the what-if simulation. The default is open: a budget with room and a model
    trusted, but no model, so the rules decide alone until ``desired.plan`` binds the served engine's."""

    budget_left: bool = True  # the engine's CPU budget has room (WhatIfBudget.left)
    model_valid: bool = True  # the model reproduces what the pods show (model_check)
    model: Engine | None = None  # the kvsim model of the served engine (engine_model); None: none exists
    # The calibrated model still disagrees with the pods by more than the stated bound (autotune/trust.py):
    # no simulation, and the rules step conservatively (the fallback flag the rules read).
    measured_only: bool = False
    # The model is fitted to the pods and trusted (autotune/trust.py), not the datasheet: it may judge a mild TPOT
    # break (judged.model_judges).
    calibrated: bool = False

    @property
    def engine(self) -> Engine | None:
        """The model the rules size their lowers with and the simulation runs on; None: the rules alone."""
        return self.model if self.budget_left and self.model_valid and not self.measured_only else None

    def recheck(self, declined_since: datetime | None, now: datetime, w: KvWindow) -> str | None:
        """Why the simulation is skipped this interval (None: run it). Once it has declined, it reruns only
        RECHECK_SECONDS later, so a pressure that persists without paying costs a simulation every few minutes,
        not every interval; most requests missing reruns it at once."""
        if declined_since is None or (w.ttft_miss_fraction or 0.0) >= SEVERE_MISSES:
            return None
        ago = (now - declined_since).total_seconds()
        if ago >= RECHECK_SECONDS:
            return None
        return (f"the simulation declined it {ago:.0f}s ago and reruns {RECHECK_SECONDS:.0f}s after that "
                f"unless most requests miss")

    def withheld(self, decision: Decision, current: int, called_for: bool) -> Decision:
        """The decision, or a hold when the budget is spent and the change is one the simulation would have had
        to confirm: unconfirmed, it may cost more than it gains, so it waits for the budget to refill.
        ``called_for``: the measurements call for it (policy.called_for), which no simulation may veto; a mild
        TPOT break that trades against TTFT misses is protective by name only, and waits like a raise."""
        if (self.model is None or not self.model_valid or self.measured_only or self.budget_left or not decision.changes
                or called_for or decision.reason in (TunerReason.OUT_OF_BOUNDS, TunerReason.ROLLED_BACK)):
            return decision
        return Decision(Action.HOLD, current, TunerReason.WHAT_IF_BUDGET_SPENT,
                        f"{decision.message}; but this engine spent its what-if CPU budget, so the change waits "
                        f"until the simulation can confirm it")


class WhatIfBudget:
    """The CPU seconds each engine's what-if plans took in the last hour: the gate's only state (owned by the
    planner, kvpilot/planning.py)."""

    def __init__(self, cpu_seconds_per_hour: float = CPU_SECONDS_PER_HOUR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cpu_seconds_per_hour = cpu_seconds_per_hour
        self.clock = clock
        self._spent: dict[EngineKey, deque[tuple[float, float]]] = {}  # engine -> (at, CPU seconds)

    def spent(self, key: EngineKey) -> float:
        """CPU seconds this engine's what-if plans took in the last hour."""
        runs = self._spent.get(key)
        if not runs:
            return 0.0
        horizon = self.clock() - BUDGET_WINDOW_SECONDS
        while runs and runs[0][0] < horizon:
            runs.popleft()
        return sum(cpu for _, cpu in runs)

    def left(self, key: EngineKey) -> bool:
        return self.spent(key) < self.cpu_seconds_per_hour

    def charge(self, key: EngineKey, cpu_seconds: float) -> None:
        self._spent.setdefault(key, deque()).append((self.clock(), cpu_seconds))

    def forget(self, key: EngineKey) -> None:
        self._spent.pop(key, None)
