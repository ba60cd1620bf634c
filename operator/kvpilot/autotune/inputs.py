"""What one tuning decision reads (``TunerInput``, in typed parts), and the two ways a rule answers (``hold``,
``move``).

The input is grouped by what the helpers need: the value in force and its bounds (the top-level fields), what
a change costs (``ChangeCost``: the cost models read only this), what the tuner remembers from status
(``TunerHistory``: the guarantees and the recheck read it), and its access to the what-if simulation
(``WhatIfGate``, autotune/gate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kvpilot.api.models import AutotuneSpec
from kvpilot.api.status import Action
from kvpilot.autotune.constants import MIN_RELATIVE_STEP
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.shift import SeenTraffic
from kvpilot.autotune.verification import Memory
from kvpilot.autotune.whatif import Engine as WhatIfEngine
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.reasons import TunerReason


@dataclass(frozen=True)
class AppliedChange:
    """One applied change of the runtime limit (status.autotune.history)."""

    at: datetime
    from_value: int
    to_value: int


@dataclass(frozen=True)
class ChangeCost:
    """What an applied change costs: it restarts each serving pod in turn (a rebuild builds first)."""

    replicas: int = 1  # serving pods; a change restarts each of them in turn
    restart_seconds: float = 120.0  # measured start-to-Ready time of a pod (the cost of a change)
    build_seconds: float = 1200.0  # how long an engine build takes (the last one, when known)
    # The rollout strategy in force: with surge (maxSurge >= 1, maxUnavailable 0) capacity never drops.
    surge: bool = False
    # The PyTorch backend's max_num_tokens, which caps the CUDA graphs kvpilot renders up to the limit
    # (trtllm/cuda_graphs.py): a change of the limit changes what a pod captures at start (autotune/costs.py
    # graph_delta). 0: no CUDA graphs follow the limit (the TensorRT backend).
    graph_max_num_tokens: int = 0


@dataclass(frozen=True)
class TunerHistory:
    """What the tuner remembers from status.autotune."""

    last_applied_at: datetime | None = None
    # Applied changes, newest first (from status.autotune.history): no A->B->A within a planning horizon.
    recent_changes: tuple[AppliedChange, ...] = ()
    # When the what-if simulation last ran and declined a change (status.autotune.whatIfDeclinedAt).
    declined_since: datetime | None = None
    # What verification keeps (status.autotune.verification): the change under verification, its evidence, and
    # the bars rollbacks left (autotune/verification.py, autotune/rollback.py).
    verification: Memory = Memory()
    # The previous window's traffic (status.kvCache.traffic, written at the last pass): whether the mix is
    # shifting (autotune/shift.py). None: unknown.
    last_traffic: SeenTraffic | None = None
    # When the run of TrafficShifting holds in force began (status.autotune.recommendation); None: not holding.
    shifting_since: datetime | None = None


@dataclass(frozen=True)
class TunerInput:
    """One tuning interval: the value in force (``current``), what bounds it (``ceiling``, ``spec``), the window,
    whether something builds or rolls, and the typed parts (``cost``, ``history``, ``what_if``)."""

    current: int
    ceiling: int
    spec: AutotuneSpec
    window: KvWindow | None
    scheduler_policy: str
    now: datetime
    rollout_in_progress: bool = False
    build_in_progress: bool = False
    # Pods that should be reporting (the serving replicas); a window from fewer is partial. 0: unknown.
    expected_pods: int = 0
    # The ceiling a rebuild may reach (the schema bound on build.maxBatchSize).
    rebuild_limit: int = 16384
    cost: ChangeCost = ChangeCost()
    history: TunerHistory = TunerHistory()
    # The what-if simulation as this decision may use it (autotune/gate.py); the default has no model: the
    # rules alone decide (a real engine whose model and GPU have no kvsim profile).
    what_if: WhatIfGate = WhatIfGate()

    @property
    def simulation(self) -> WhatIfEngine | None:
        """The kvsim model the tuner may size with and simulate on; None: the rules decide alone."""
        return self.what_if.engine


def bounds(inp: TunerInput) -> tuple[int, int]:
    hi = min(inp.spec.max_batch_size, inp.ceiling)
    lo = min(inp.spec.min_batch_size, hi)
    return lo, hi


def hold(inp: TunerInput, reason: TunerReason, message: str) -> Decision:
    return Decision(Action.HOLD, inp.current, reason, message)


def move(inp: TunerInput, target: int, reason: TunerReason, message: str, min_step: float = MIN_RELATIVE_STEP) -> Decision:
    lo, hi = bounds(inp)
    target = max(lo, min(hi, target))
    if target == inp.current:
        return hold(inp, reason, message + f"; already at the bound {target}")
    if abs(target - inp.current) < min_step * inp.current:
        return hold(inp, TunerReason.CHANGE_TOO_SMALL, message + f"; {inp.current}->{target} is not worth a restart")
    action = Action.RAISE if target > inp.current else Action.LOWER
    return Decision(action, target, reason, message + f"; {inp.current}->{target}")
