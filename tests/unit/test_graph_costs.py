"""The tuner prices CUDA graphs into a change on the PyTorch backend (autotune/costs.py): a raise that captures
more graphs starts slower and carves a smaller KV pool. kvpilot's own model (trtllm/cuda_graphs.py and the
stated assumptions in costs.py) is held here to kvsim's, which the rules never import."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from kvsim.config import Backend, EngineConfig
from kvsim.cuda_graphs import CudaGraphs
from kvsim.memory import engine_graphs, plan_for

from kvpilot.autotune.costs import change_restart_seconds, graph_delta, worth_a_restart
from kvpilot.autotune.inputs import ChangeCost, TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.window import KvWindow
from kvpilot.trtllm.cuda_graphs import captured_batch_sizes, graph_token_cap
from kvpilot.trtllm.serve import cuda_graph_config
from tests.unit.helpers import engine

PROFILE = "llama-3.1-8b-fp8-h100"
TORCH = ChangeCost(replicas=2, restart_seconds=30.0, graph_max_num_tokens=8192)
TRT = replace(TORCH, graph_max_num_tokens=0)


def kvsim_engine(limit: int, tokens: int = 8192) -> EngineConfig:
    """kvsim's PyTorch pod given the cuda_graph_config kvpilot renders at ``limit``."""
    return EngineConfig(profile=PROFILE, backend=Backend.PYTORCH, build_max_batch_size=limit, max_batch_size=limit,
                        build_max_num_tokens=tokens, max_num_tokens=tokens, max_seq_len=4096,
                        cuda_graphs=CudaGraphs.from_llm_api(cuda_graph_config(limit, tokens))).resolved()


@pytest.mark.parametrize("limit,tokens", [(1, 8192), (7, 8192), (64, 8192), (128, 8192), (129, 8192), (200, 8192),
                                          (256, 8192), (512, 8192), (1000, 8192), (4096, 8192), (512, 300)])
def test_kvpilot_captures_the_sizes_kvsim_reads_from_the_same_rendering(limit: int, tokens: int) -> None:
    graphs = engine_graphs(kvsim_engine(limit, tokens))
    assert graphs is not None
    assert captured_batch_sizes(limit, tokens) == graphs.sizes


def test_the_stated_assumptions_price_what_kvsim_charges() -> None:
    """Capture seconds exactly; the KV pool taken within 25% above kvsim's (kvpilot counts the whole graph
    memory, kvsim carves free_gpu_memory_fraction of what is left), never below it."""
    for current, target in [(8, 64), (64, 128), (128, 256), (64, 512), (512, 1024)]:
        delta = graph_delta(TORCH, current, target)
        before, after = kvsim_engine(current), kvsim_engine(target)
        g0, g1 = engine_graphs(before), engine_graphs(after)
        assert g0 is not None and g1 is not None
        assert delta.graphs == len(g1.sizes) - len(g0.sizes)
        assert delta.seconds == pytest.approx(g1.capture_s - g0.capture_s)
        kvsim_tokens = (plan_for(before).num_blocks - plan_for(after).num_blocks) * before.tokens_per_block
        assert kvsim_tokens <= delta.kv_tokens <= 1.25 * kvsim_tokens, (current, target)


def test_a_raise_that_captures_more_graphs_starts_slower_and_a_lower_faster() -> None:
    up, down = graph_delta(TORCH, 64, 512), graph_delta(TORCH, 512, 64)
    assert up.graphs == 10 and up.seconds == pytest.approx(1.0) and up.kv_tokens > 0
    assert (down.graphs, down.seconds, down.kv_tokens) == (-up.graphs, pytest.approx(-up.seconds), -up.kv_tokens)
    assert change_restart_seconds(TORCH, 64, 512) == pytest.approx(31.0)
    assert change_restart_seconds(TORCH, 512, 64) == pytest.approx(29.0)
    assert graph_delta(TRT, 64, 512) == graph_delta(TORCH, 64, 64) == type(up)()  # TensorRT: no graphs follow
    # Above max_num_tokens nothing more is captured: no cost for the part of a raise the graphs do not follow.
    capped = replace(TORCH, graph_max_num_tokens=256)
    assert graph_delta(capped, 256, 1024).graphs == 0 and graph_delta(capped, 256, 1024).kv_tokens == 0


def window(max_blocks: int = 20000, queued: float = 4.0) -> KvWindow:
    return KvWindow(samples=12, pods=2, peak_utilization=0.4, mean_utilization=0.35, peak_used_blocks=8000,
                    max_blocks=max_blocks, tokens_per_block=32, peak_active=64, mean_active=64.0, peak_queued=8,
                    mean_queued=queued, paused=0, runtime_batch_size=0, completion_rate=3.0, queue_growth=0.05,
                    active_limit=64, full_waiting_share=1.0)


def test_the_restart_cost_counts_the_capture_time_and_the_pool_the_graphs_take() -> None:
    w = window()
    _, trt = worth_a_restart(TRT, 64, w, 0.1, 512)
    _, torch = worth_a_restart(TORCH, 64, w, 0.1, 512)
    spent = {name: float(text.split("caused ")[1].split("s of")[0]) for name, text in (("trt", trt), ("torch", torch))}
    assert spent["torch"] > spent["trt"]
    assert "CUDA graphs +10 (+1.0s start-up" in torch and "CUDA graphs" not in trt
    # A pool the graphs would mostly take: the raise gains nothing, so it cannot drain the backlog.
    tiny = window(max_blocks=160)
    assert worth_a_restart(TRT, 64, tiny, 0.1, 512)[0]
    ok, why = worth_a_restart(TORCH, 64, tiny, 0.1, 512)
    assert not ok and "could not drain the backlog" in why and "CUDA graphs +10" in why


def test_the_tuner_s_decision_on_pytorch_names_the_graph_cost() -> None:
    spec = engine(autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 1024}).spec.autotune
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)

    def decided(cost: ChangeCost) -> str:
        d = decide(TunerInput(current=64, ceiling=1024, spec=spec, window=window(queued=40.0),
                              scheduler_policy="GuaranteedNoEvict",
                              now=now, expected_pods=2, cost=cost))
        assert d.action == "Raise", d.message
        return d.message

    assert "CUDA graphs +" in decided(TORCH) and "CUDA graphs" not in decided(TRT)


def test_only_pytorch_engines_have_graphs_following_the_limit() -> None:
    assert graph_token_cap(engine("pytorch").spec) == engine("pytorch").spec.batching.max_num_tokens > 0
    assert graph_token_cap(engine("simulated", runtime__simulation={"profile": PROFILE, "backend": "pytorch"}).spec) > 0
    assert graph_token_cap(engine("tensorrt").spec) == 0
    assert graph_token_cap(engine("simulated", runtime__simulation={"profile": PROFILE}).spec) == 0
