"""Cost models: what a rolling restart costs in missed traffic, against what a change is expected to fix.

They read only what a change costs (``ChangeCost``), the limit in force and the window (fluid models, no
simulation; the what-if in ``whatif.py`` checks their verdict where a kvsim model exists).
"""

from __future__ import annotations

from kvpilot.autotune.constants import LOWER_MARGIN, MAX_RAISE_FACTOR, PLANNING_HORIZON_SECONDS, SEVERE_MISSES
from kvpilot.autotune.inputs import ChangeCost
from kvpilot.autotune.signals import load as load_of
from kvpilot.autotune.window import KvWindow


def worth_a_restart(cost: ChangeCost, current: int, w: KvWindow, misses: float, target: int,
                    horizon: float = PLANNING_HORIZON_SECONDS) -> tuple[bool, str]:
    """Misses avoided over the planning horizon against the misses a rolling restart adds (a fluid model).

    Restarting one of N pods takes 1/N of the capacity away for ``restart_seconds``, one pod after another.
    Traffic the others cannot absorb piles up as a backlog, which the new, larger capacity must then drain;
    requests arriving until it has drained wait too long. Capacity is assumed to grow at most in proportion
    to the limit (decode is memory-bound), so the estimate of the drain is optimistic only within x2."""
    if misses >= SEVERE_MISSES:
        return True, f"{misses:.0%} of requests already miss: a restart cannot make it worse for long"
    n = max(1, cost.replicas)
    load = 1.0 + misses if w.mean_queued >= 1 else load_of(current, w)
    growth = max(0.0, n * load - (n - 1))  # backlog growth while one pod restarts, in pod-capacities
    spent = 0.0
    if growth > 0:
        spare = n * min(target / current, MAX_RAISE_FACTOR) - n * load
        if spare <= 0:
            return False, "the new limit could not drain the backlog a restart leaves"
        backlog = n * cost.restart_seconds * growth
        spent = (n * cost.restart_seconds + backlog / spare) * (1.0 - misses)
    benefit = max(0.0, horizon) * misses
    return benefit > spent, f"expected misses avoided {benefit:.0f}s vs caused {spent:.0f}s of traffic"


def restart_cost_seconds(cost: ChangeCost, load: float) -> float:
    """Seconds of the fleet's traffic a rolling restart makes miss (a fluid model; the rollout in force).

    With surge (a new pod is Ready before an old one stops) capacity never drops: only the requests cut off
    or slowed by the switch count, about a tenth of a restart per pod. Without surge, each of the N pods is
    down ``restart_seconds`` in turn; the others carry (N-1)/N of the capacity, so the share of traffic over
    that misses while one pod is down, and about as long again while the backlog drains."""
    n = max(1, cost.replicas)
    per_pod = cost.restart_seconds
    if cost.surge:
        return 0.1 * per_pod * n
    excess = max(0.0, load - (n - 1) / n) / max(load, 1e-9)
    return n * per_pod * (excess * 2.0 + 0.1)


def lower_pays(cost: ChangeCost, current: int, w: KvWindow, misses: float) -> tuple[bool, str]:
    """A protective lower is worth it when the misses it may fix over the horizon (prudently, half of them)
    exceed LOWER_MARGIN times what the restart costs."""
    load = 1.0 if w.mean_queued >= 1 else load_of(current, w)
    spent = restart_cost_seconds(cost, load)
    benefit = 0.5 * misses * PLANNING_HORIZON_SECONDS
    return benefit > LOWER_MARGIN * spent, f"misses fixed {benefit:.0f}s vs restart {spent:.0f}s of traffic"
