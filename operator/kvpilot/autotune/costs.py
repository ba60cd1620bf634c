"""Cost models: what a rolling restart costs in missed traffic, against what a change is expected to fix.

They read only what a change costs (``ChangeCost``), the limit in force and the window (fluid models, no
simulation; the what-if in ``whatif.py`` checks their verdict where a kvsim model exists).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpilot.api.models import SloSpec
from kvpilot.autotune.constants import LOWER_MARGIN, MAX_RAISE_FACTOR, PLANNING_HORIZON_SECONDS, SEVERE_MISSES
from kvpilot.autotune.inputs import ChangeCost
from kvpilot.autotune.signals import load as load_of
from kvpilot.autotune.signals import restart_load
from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.cuda_graphs import captured_batch_sizes

# What capturing CUDA graphs costs a PyTorch pod at start, before its KV pool is carved. Stated assumptions, not
# measurements: kvsim's (simulator/kvsim/cuda_graphs.py: 0.1 s and 2 MiB per captured size, and a pool holding the
# largest captured batch's decode activations and FP32 logits), expressed in KV-cache tokens of Llama-3.1-8B with
# an FP8 cache (64 KiB a token: ~9.4 tokens of activations and logits per sequence, 32 per graph's 2 MiB) so the
# tuner needs no model figures; a model with more KV per token pays fewer tokens. tests/unit/test_graph_costs.py
# holds them to kvsim's figures.
CAPTURE_SECONDS_PER_GRAPH = 0.1
GRAPH_KV_TOKENS = 32.0
GRAPH_POOL_KV_TOKENS_PER_SEQUENCE = 10.0


@dataclass(frozen=True)
class GraphDelta:
    """What moving the limit changes in the CUDA graphs a pod captures (the PyTorch backend; zero elsewhere):
    graphs added (negative: dropped), the start-up seconds they add, and the KV-cache tokens the graph memory
    takes from the pool."""

    graphs: int = 0
    seconds: float = 0.0
    kv_tokens: float = 0.0

    def note(self) -> str:
        """The delta as a decision message reads it ('' when nothing changes)."""
        if not self.graphs and not self.kv_tokens:
            return ""
        return (f"; CUDA graphs {self.graphs:+d} ({self.seconds:+.1f}s start-up, {self.kv_tokens:+.0f} KV tokens "
                f"of graph memory)")


def _graph_footprint(sizes: tuple[int, ...]) -> tuple[float, float]:
    """(capture seconds, KV tokens of graph memory) of capturing ``sizes``."""
    if not sizes:
        return 0.0, 0.0
    return (len(sizes) * CAPTURE_SECONDS_PER_GRAPH,
            len(sizes) * GRAPH_KV_TOKENS + max(sizes) * GRAPH_POOL_KV_TOKENS_PER_SEQUENCE)


def graph_delta(cost: ChangeCost, current: int, target: int) -> GraphDelta:
    """The CUDA graphs a pod captures at ``target`` against those at ``current``, as kvpilot renders them."""
    if cost.graph_max_num_tokens <= 0 or current <= 0 or target <= 0:
        return GraphDelta()
    before = captured_batch_sizes(current, cost.graph_max_num_tokens)
    after = captured_batch_sizes(target, cost.graph_max_num_tokens)
    (s0, t0), (s1, t1) = _graph_footprint(before), _graph_footprint(after)
    return GraphDelta(len(after) - len(before), s1 - s0, t1 - t0)


def change_restart_seconds(cost: ChangeCost, current: int, target: int) -> float:
    """A pod's start-to-Ready after the change: the measured one (which includes capturing today's graphs) plus
    the capture time of the graphs ``target`` adds (less, of those it drops)."""
    return max(0.0, cost.restart_seconds + graph_delta(cost, current, target).seconds)


def worth_a_restart(cost: ChangeCost, current: int, w: KvWindow, misses: float, target: int,
                    horizon: float = PLANNING_HORIZON_SECONDS) -> tuple[bool, str]:
    """Misses avoided over the planning horizon against the misses a rolling restart adds (a fluid model).

    Restarting one of N pods takes 1/N of the capacity away for the restart, one pod after another.
    Traffic the others cannot absorb piles up as a backlog, which the new, larger capacity must then drain;
    requests arriving until it has drained wait too long. Capacity is assumed to grow at most in proportion
    to the limit (decode is memory-bound), so the estimate of the drain is optimistic only within x2.

    On the PyTorch backend the raise also captures more CUDA graphs (``graph_delta``): the restart takes their
    capture time longer, and the capacity gained shrinks by the share of the KV pool their memory takes (read
    as if the pool bound, the prudent side)."""
    if misses >= SEVERE_MISSES:
        return True, f"{misses:.0%} of requests already miss: a restart cannot make it worse for long"
    n = max(1, cost.replicas)
    graphs = graph_delta(cost, current, target)
    restart = change_restart_seconds(cost, current, target)
    if cost.surge:
        return _worth_with_surge(cost, restart, misses, horizon, graphs)
    pool_tokens = w.max_blocks * w.tokens_per_block
    pool_left = max(0.0, 1.0 - graphs.kv_tokens / pool_tokens) if pool_tokens > 0 and graphs.kv_tokens > 0 else 1.0
    load = 1.0 + misses if w.mean_queued >= 1 else load_of(current, w)
    growth = max(0.0, n * load - (n - 1))  # backlog growth while one pod restarts, in pod-capacities
    spent = 0.0
    if growth > 0:
        spare = n * min(target / current, MAX_RAISE_FACTOR) * pool_left - n * load
        if spare <= 0:
            return False, "the new limit could not drain the backlog a restart leaves" + graphs.note()
        backlog = n * restart * growth
        spent = (n * restart + backlog / spare) * (1.0 - misses)
    benefit = max(0.0, horizon) * misses
    return benefit > spent, f"expected misses avoided {benefit:.0f}s vs caused {spent:.0f}s of traffic{graphs.note()}"


def _worth_with_surge(cost: ChangeCost, restart: float, misses: float, horizon: float,
                      graphs: GraphDelta) -> tuple[bool, str]:
    """``worth_a_restart`` where new pods start beside the old (surge): no capacity is taken away, so no backlog
    grows; the misses go on until the new pods are Ready (as they would without the change), and the switch
    costs what ``restart_cost_seconds`` prices. Before, a surge raise was priced as a rolling restart without
    spare GPUs: on document Q&A then chat with a spare GPU, chat's arrival (11-23% of the requests missing TTFT)
    waited 75 s for the misses to pay for a backlog that surge never makes (docs/tuner-suite.md, "Tenth pass")."""
    spent = restart_cost_seconds(replace(cost, restart_seconds=restart), 1.0) * (1.0 - misses)
    benefit = max(0.0, horizon - restart) * misses
    return benefit > spent, (f"expected misses avoided {benefit:.0f}s vs caused {spent:.0f}s of traffic (surge)"
                             f"{graphs.note()}")


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


def lower_pays(cost: ChangeCost, current: int, w: KvWindow, misses: float, slo: SloSpec | None) -> tuple[bool, str]:
    """A protective lower is worth it when the misses it may fix over the horizon (prudently, half of them)
    exceed LOWER_MARGIN times what the restart costs (priced at the load the objectives leave room for,
    ``signals.restart_load``, which is full while TPOT is broken: a TPOT lower is priced at the whole restart).
    When most requests miss, as for a raise (``worth_a_restart``), acting beats any restart cost: without surge,
    four pods of five minutes' start would otherwise never pay for a lower."""
    if misses >= SEVERE_MISSES:
        return True, f"{misses:.0%} of requests miss: a restart cannot make it worse for long"
    spent = restart_cost_seconds(cost, restart_load(slo, current, w))
    benefit = 0.5 * misses * PLANNING_HORIZON_SECONDS
    return benefit > LOWER_MARGIN * spent, f"misses fixed {benefit:.0f}s vs restart {spent:.0f}s of traffic"
