"""kvsim plays the PyTorch backend: its iteration stats, CUDA graphs (the ceiling and the capture's memory), its KV
pool after the estimation pass, and the releases that no longer have the TensorRT backend."""

from __future__ import annotations

import pytest
from kvsim.config import Backend, EngineConfig
from kvsim.cuda_graphs import (
    EAGER_LAUNCH_S_PER_LAYER,
    GRAPH_CAPTURE_S,
    CudaGraphs,
    generated_batch_sizes,
)
from kvsim.engine import Engine
from kvsim.memory import engine_graphs, plan_for
from kvsim.request import Request
from kvsim.serve.args import parse
from kvsim.serve.settings import ServeError, resolve
from kvsim.trtllm.checkpoint import main as checkpoint_main

PROFILE = "llama-3.1-8b-fp8-h100"


def torch_config(**overrides) -> EngineConfig:
    base = dict(profile=PROFILE, backend=Backend.PYTORCH, build_max_batch_size=512, max_batch_size=512,
                build_max_num_tokens=8192, max_seq_len=4096)
    base.update(overrides)
    return EngineConfig(**base)


def graphs_to(max_bs: int, padding: bool = False) -> CudaGraphs:
    return CudaGraphs.from_llm_api({"max_batch_size": max_bs, "enable_padding": padding})


def test_generated_sizes_follow_cuda_graph_config() -> None:
    assert generated_batch_sizes(128, False) == tuple(range(1, 32)) + (32, 64, 128)
    assert generated_batch_sizes(128, True) == (1, 2, 4) + tuple(range(8, 129, 8))
    assert generated_batch_sizes(1000, False)[-4:] == (128, 256, 512, 1000)
    assert CudaGraphs().batch_sizes == generated_batch_sizes(128, False)  # neither given: 128
    assert CudaGraphs.from_llm_api({"batch_sizes": [64, 8, 1]}).batch_sizes == (1, 8, 64)
    both = {"batch_sizes": list(generated_batch_sizes(256, False)), "max_batch_size": 256}
    assert CudaGraphs.from_llm_api(both).batch_sizes[-1] == 256


@pytest.mark.parametrize("section,why", [
    ({"batch_sizes": [1, 2], "max_batch_size": 64}, "Please don't set both"),
    ({"max_batch_size": -1}, "must be non-negative"), ({"max_batch_size": "128"}, "valid integer"),
    ({"enable_padding": "yes"}, "valid boolean"), ({"batch_size": [1]}, "batch_size: Extra inputs"),
    ({"batch_sizes": [0, 4]}, "positive integers"), ({"batch_sizes": "1,2"}, "positive integers"),
    ({"max_batch_size": 10**9}, "at most"), ([1, 2], "must be a mapping"),
])
def test_hostile_cuda_graph_config_is_refused_naming_the_field(section, why) -> None:
    with pytest.raises(ValueError, match=why):
        CudaGraphs.from_llm_api(section)


def test_the_engine_captures_only_what_its_limits_allow() -> None:
    """_filter_cuda_graph_batch_sizes: sizes up to min(max_batch_size, max_num_tokens); padding pads to the cap."""
    assert graphs_to(512).captured(200, 8192)[-1] == 128
    assert graphs_to(512, padding=True).captured(200, 8192)[-1] == 200
    assert engine_graphs(torch_config(max_batch_size=64, build_max_batch_size=64)).max_size == 64
    assert engine_graphs(torch_config(cuda_graphs=None)).sizes == ()
    assert engine_graphs(EngineConfig(profile=PROFILE)) is None  # TensorRT: no graphs


def test_a_batch_above_the_largest_graph_decodes_eagerly_and_slower() -> None:
    """The ceiling: 256 sequences with graphs to 128 decode slower per step than with graphs to 256."""
    def step_s(graphs: CudaGraphs | None, n: int) -> float:
        return Engine(torch_config(cuda_graphs=graphs), epoch_s=0.0).model.iteration_s(n, n * 1000, [])

    eager, graphed = step_s(graphs_to(128), 256), step_s(graphs_to(256), 256)
    assert eager == pytest.approx(graphed + 32 * EAGER_LAUNCH_S_PER_LAYER)  # the stated assumption, 32 layers
    assert step_s(graphs_to(128), 128) == step_s(graphs_to(256), 128)  # below the ceiling: the same
    assert step_s(None, 128) > step_s(graphs_to(128), 128)  # graphs off: every decode step eager
    # without padding a size between captured ones (33: 32 and 64 are captured) is eager too; padding rounds up
    assert step_s(graphs_to(128), 33) > step_s(graphs_to(128, padding=True), 33)


def test_the_ceiling_shows_in_the_served_tpot() -> None:
    def mean_tpot(graphs: CudaGraphs) -> float:
        engine = Engine(torch_config(cuda_graphs=graphs), epoch_s=0.0)
        for i in range(256):
            engine.submit(Request(prompt_tokens=64, output_tokens=200, max_tokens=200, request_id=i))
        engine.run_until_idle()
        records = engine.finished_requests()
        return sum(r.tpot_s or 0.0 for r in records) / len(records)

    assert mean_tpot(graphs_to(128)) > mean_tpot(graphs_to(256)) * 1.02


def test_capturing_costs_gpu_memory_before_the_pool_is_carved() -> None:
    off, to_128, to_512 = (plan_for(torch_config(cuda_graphs=g).resolved()) for g in (None, graphs_to(128),
                                                                                         graphs_to(512)))
    assert off.num_blocks > to_128.num_blocks > to_512.num_blocks
    graph_bytes = engine_graphs(torch_config(cuda_graphs=graphs_to(512)).resolved()).memory_bytes(
        torch_config().resolved_profile)
    assert (off.num_blocks - to_512.num_blocks) == pytest.approx(graph_bytes * 0.9 / off.bytes_per_block, abs=1)
    assert engine_graphs(torch_config(cuda_graphs=graphs_to(512))).capture_s == pytest.approx(
        len(generated_batch_sizes(512, False)) * GRAPH_CAPTURE_S)


def test_the_pytorch_pool_has_no_decoder_slots_to_pay_for() -> None:
    """After the estimation pass the pool is fraction x (total - peak): no C++ decoder state per slot, so a larger
    max_batch_size costs nothing once the graphs stop at 128 (and the TensorRT pool does pay per slot)."""
    def blocks(backend: Backend, bs: int) -> int:
        return plan_for(torch_config(backend=backend, build_max_batch_size=bs, max_batch_size=bs).resolved()).num_blocks

    assert blocks(Backend.PYTORCH, 256) == blocks(Backend.PYTORCH, 2048)
    assert blocks(Backend.TENSORRT, 256) > blocks(Backend.TENSORRT, 2048)
    assert blocks(Backend.PYTORCH, 2048) > blocks(Backend.TENSORRT, 2048)


def test_iteration_stats_have_pytorch_s_shape() -> None:
    engine = Engine(torch_config(max_batch_size=8, build_max_batch_size=8), epoch_s=0.0)
    for i in range(12):
        engine.submit(Request(prompt_tokens=100, output_tokens=50, max_tokens=50, request_id=i))
    engine.advance_to(0.05)
    stats = engine.drain_iteration_stats()
    assert stats
    for s in stats:
        for key in ("maxBatchSizeStatic", "maxBatchSizeRuntime", "maxBatchSizeTunerRecommended", "maxNumTokensStatic",
                    "maxNumTokensRuntime", "maxNumTokensTunerRecommended"):
            assert s[key] == 0, key
        assert s["maxNumActiveRequests"] == 8 and s["iterLatencyMS"] > 0 and s["kvCacheStats"]["maxNumBlocks"] > 0
        assert set(s["staticBatchingStats"].values()) == {0}
        assert s["inflightBatchingStats"]["avgNumDecodedTokensPerIter"] == 0
    assert max(s["numActiveRequests"] for s in stats) == 8 and max(s["numQueuedRequests"] for s in stats) == 4
    assert any(s["inflightBatchingStats"]["numGenRequests"] == 8 for s in stats)
    assert any(s["inflightBatchingStats"]["numCtxTokens"] > 0 for s in stats)


def test_the_in_engine_tuner_does_not_exist_on_pytorch() -> None:
    with pytest.raises(ValueError, match="only on the TensorRT backend"):
        torch_config(enable_batch_size_tuning=True).resolved()


@pytest.fixture
def ckpt(tmp_path):
    checkpoint_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt")])
    return tmp_path / "ckpt"


def serve_settings(ckpt, tmp_path, yaml_text: str | None = None, release: str = "1.4", *extra: str):
    argv = [str(ckpt), "--max_batch_size", "256", "--max_seq_len", "8192", *extra]
    if yaml_text is not None:
        (tmp_path / "extra.yaml").write_text(yaml_text)
        argv += ["--extra_llm_api_options", str(tmp_path / "extra.yaml")]
    env = {"KVSIM_PROFILE": PROFILE, "KVSIM_TRTLLM_RELEASE": release}
    return resolve(parse(argv, env), env)


def test_serve_reads_cuda_graph_config_as_the_release_does(ckpt, tmp_path) -> None:
    default = serve_settings(ckpt, tmp_path)
    assert default.backend == "pytorch" and default.engine.cuda_graphs == CudaGraphs()
    assert not default.engine.enable_batch_size_tuning  # the serve CLI's dynamic_batch_config has no effect here
    assert default.version == "1.4.0rc1"
    raised = serve_settings(ckpt, tmp_path, "cuda_graph_config: {max_batch_size: 256, enable_padding: true}\n")
    assert engine_graphs(raised.engine).max_size == 256 and raised.engine.cuda_graphs.enable_padding
    assert serve_settings(ckpt, tmp_path, "cuda_graph_config: null\n").engine.cuda_graphs is None
    with pytest.raises(ServeError, match="cuda_graph_config.max_batch_size must be non-negative"):
        serve_settings(ckpt, tmp_path, "cuda_graph_config: {max_batch_size: -4}\n")


def test_releases_without_the_tensorrt_backend_refuse_it_as_the_real_tools_do(ckpt, tmp_path, capsys,
                                                                              monkeypatch) -> None:
    from kvsim.serve.cli import main as serve_main
    from kvsim.trtllm.build import main as build_main

    for release in ("1.4", "1.4.0rc1", "1.3.0rc22"):
        monkeypatch.setenv("KVSIM_TRTLLM_RELEASE", release)
        monkeypatch.setenv("KVSIM_PROFILE", PROFILE)
        with pytest.raises(SystemExit) as exit_info:
            serve_main([str(ckpt), "--backend", "tensorrt"])
        assert exit_info.value.code == 2
        assert ("Error: Invalid value for '--backend': 'tensorrt' is not one of 'pytorch', '_autodeploy'."
                in capsys.readouterr().err)
        assert build_main(["--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "e")]) == 127
        assert capsys.readouterr().err.strip() == "trtllm-build: command not found"
        assert not (tmp_path / "e").exists()
    monkeypatch.setenv("KVSIM_TRTLLM_RELEASE", "1.3.0rc20")  # the last rc with the TensorRT backend
    assert build_main(["--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "e")]) == 0
    with pytest.raises(ServeError, match="has no TensorRT backend"):
        serve_settings(tmp_path / "e", tmp_path, None, "1.4", "--backend", "pytorch")
    with pytest.raises(ServeError, match="backend: Input should be 'pytorch' or '_autodeploy'"):
        serve_settings(ckpt, tmp_path, "backend: tensorrt\n", "1.4")


@pytest.mark.parametrize("release,prefix", [("1.2.1", ""), ("1.3", "trtllm_"), ("1.4", "trtllm_")])
def test_prometheus_on_pytorch_per_release(ckpt, tmp_path, release, prefix) -> None:
    from kvsim.serve.server import SimServer
    from prometheus_client.parser import text_string_to_metric_families

    def families(yaml_text: str) -> dict[str, float]:
        server = SimServer(serve_settings(ckpt, tmp_path, yaml_text, release))
        out = {}
        for family in text_string_to_metric_families(server.metrics.render().decode()):
            out[family.name] = family.samples[0].value if family.samples else float("nan")
        return out

    with_stats = families("enable_iter_perf_stats: true\nreturn_perf_metrics: true\n")
    assert f"{prefix}time_to_first_token_seconds" in with_stats
    if not prefix:  # 1.2's collector: no gauges on either backend
        assert "kv_cache_max_blocks" not in with_stats and not any(n.startswith("trtllm_") for n in with_stats)
        return
    assert with_stats["trtllm_kv_cache_max_blocks"] > 0
    assert with_stats["trtllm_max_batch_size_static"] == 0 == with_stats["trtllm_max_batch_size_runtime"]
    without = families("return_perf_metrics: true\n")  # no iteration stats on PyTorch: no gauges from them
    assert "trtllm_time_to_first_token_seconds" in without and "trtllm_kv_cache_max_blocks" not in without
