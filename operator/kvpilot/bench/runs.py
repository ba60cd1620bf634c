"""The suite's fixed-schedule runs on the harness fleet: static values, per-phase schedules and the reactive bound.

Every run uses the same harness as the tuner's (``autotune/fleet.py``) and the served engine of the row: the
case's profile, perturbed where the row says so (``bench/perturb.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvsim import EngineConfig, Request, RequestRecord
from kvsim.memory import plan_for
from kvsim.perturb import Perturbation

from kvpilot.autotune.fleet import Fleet
from kvpilot.bench.cases import Case
from kvpilot.bench.perturb import NOMINAL, served_profile
from kvpilot.bench.tuner import Slo, engine_config, goodput

SWEEP = (32, 64, 128, 256, 512, 1024)
CEILING = 1024
START = 64
# TensorRT-LLM's default runtime limit (and build ceiling): the peer a user would pick instead of kvpilot.
TRTLLM_DEFAULT = 2048
# The reactive bound: each phase's best static value, each change made this long after the evidence could exist
# (t=0 for the start, each phase boundary), paying the rollout. One tuning interval (autotune.intervalSeconds'
# default, 15 s): the first window after a shift is the earliest a tuner that measures can act on (the pods are
# warm when the run starts).
REACT_SECONDS = 15.0


@dataclass(frozen=True)
class Served:
    """One row's engine: a case, and how the served engine differs from the profile it names."""

    case: Case
    perturbation: Perturbation = NOMINAL

    def config(self, limit: int, ceiling: int = CEILING, in_engine_tuner: bool = False) -> EngineConfig:
        return engine_config(served_profile(self.case.profile, self.perturbation), ceiling, limit,
                             in_engine_tuner=in_engine_tuner, policy=self.case.policy, backend=self.case.backend)

    @property
    def slo(self) -> Slo:
        return Slo(self.case.ttft_ms, self.case.tpot_ms)


def phase_goodput(records: list[RequestRecord], case: Case, start: float, end: float) -> int:
    """Requests arriving in [start, end) that met both objectives."""
    slo = Slo(case.ttft_ms, case.tpot_ms)
    return sum(
        1 for r in records
        if start <= r.arrival_s < end and r.finish_s is not None and r.ttft_s is not None
        and r.ttft_s * 1e3 <= slo.ttft_ms and (r.tpot_s is None or r.tpot_s * 1e3 <= slo.tpot_ms)
    )


def cannot_start(config: EngineConfig) -> str | None:
    """Why a pod with ``config`` would not start on its GPU (kvsim's memory plan: the weights and the activations
    that max_batch_size and max_num_tokens size do not fit), or None when it starts. TensorRT-LLM's default (2048)
    does not fit an L4 with 20% less memory than kvsim's profile: its pods would fail at load, serving nothing."""
    try:
        plan_for(config.resolved())
    except ValueError as exc:
        return str(exc)
    return None


def run_static_records(requests: list[Request], served: Served, config: EngineConfig,
                       horizon: float) -> tuple[dict[str, float], list[RequestRecord]]:
    """``config`` held for the whole run (no restart)."""
    case = served.case
    fleet = Fleet(config, case.replicas, restart_s=0.0, queue_timeout_s=case.queue_timeout_s, iteration_stats=False)
    for req in requests:
        fleet.advance(req.arrival_s)
        fleet.submit(req)
    fleet.advance(horizon)
    return goodput(fleet.records, len(requests), served.slo, case.duration_s), fleet.records


def run_changes(requests: list[Request], served: Served, start: int, changes: list[tuple[float, int]],
                horizon: float) -> dict[str, Any]:
    """From ``start``, roll to each (time, value) in turn, paying every rollout (the rollout strategy of the case:
    both replicas surge at once with a spare GPU, else one pod at a time)."""
    case = served.case
    fleet = Fleet(served.config(start), case.replicas, case.restart_s, surge=case.spare_gpu,
                  queue_timeout_s=case.queue_timeout_s, max_surge=case.replicas, iteration_stats=False)
    pending = sorted(changes)
    for req in requests:
        while pending and req.arrival_s >= pending[0][0]:
            at, value = pending.pop(0)
            advance_through_rollout(fleet, at)
            fleet.roll_to(served.config(value))
        advance_through_rollout(fleet, req.arrival_s)
        fleet.submit(req)
    advance_through_rollout(fleet, horizon)
    return goodput(fleet.records, len(requests), served.slo, case.duration_s)


def schedule_changes(schedule: list[int], boundaries: list[float]) -> list[tuple[float, int]]:
    """A per-phase schedule as changes at the phase boundaries where the value moves."""
    return [(at, schedule[k + 1]) for k, at in enumerate(boundaries) if schedule[k + 1] != schedule[k]]


def phase_best(per_phase: dict[int, list[int]], phases: int) -> list[int]:
    """Each phase's best static value; where the value in force (START for the first phase) is within 1% of
    the best it stays (a tuner that measures has no reason to move, and a later phase's needs are unknown)."""
    out, value = [], START
    for k in range(phases):
        top = max(per_phase[m][k] for m in per_phase)
        if per_phase.get(value, [0] * phases)[k] < 0.99 * top:
            value = max(per_phase, key=lambda m: (per_phase[m][k], -abs(math.log(m / value))))
        out.append(value)
    return out


def reactive_changes(schedule: list[int], boundaries: list[float],
                     react_s: float = REACT_SECONDS) -> list[tuple[float, int]]:
    """The hindsight schedule as a tuner that needs ``react_s`` of evidence could follow it from START."""
    out, value = [], START
    for at, want in zip([0.0, *boundaries], schedule):
        if want != value:
            out.append((at + react_s, want))
            value = want
    return out


def advance_through_rollout(fleet: Fleet, t: float) -> None:
    while fleet.next_transition() < t:
        fleet.advance(fleet.next_transition())
    fleet.advance(t)
