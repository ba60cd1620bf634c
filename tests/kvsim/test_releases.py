"""kvsim plays a named TensorRT-LLM release (KVSIM_TRTLLM_RELEASE): what it refuses, clamps and exposes."""

from __future__ import annotations

import pytest
from kvsim.engine import Engine
from kvsim.serve.args import parse
from kvsim.serve.cli import main as serve_main
from kvsim.serve.prom import ServeMetrics
from kvsim.serve.settings import ServeError, resolve
from kvsim.trtllm.build import main as build_main
from kvsim.trtllm.checkpoint import main as checkpoint_main
from kvsim.trtllm.releases import RELEASES
from kvsim.trtllm.releases import resolve as release
from prometheus_client.parser import text_string_to_metric_families

PROFILE = {"KVSIM_PROFILE": "llama-3.1-8b-fp8-h100"}


def env(name: str) -> dict[str, str]:
    return {**PROFILE, "KVSIM_TRTLLM_RELEASE": name}


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rel")
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(root / "ckpt")])
    assert build_main(["--checkpoint_dir", str(root / "ckpt"), "--output_dir", str(root / "engine"),
                       "--max_batch_size", "64", "--max_num_tokens", "4096", "--max_seq_len", "4096",
                       "--max_input_len", "3072"]) == 0
    return root / "engine"


def args(engine_dir, tmp_path, yaml_text: str | None = None, *extra: str):
    argv = [str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "32", "--max_num_tokens", "4096", *extra]
    if yaml_text is not None:
        path = tmp_path / "extra.yaml"
        path.write_text(yaml_text)
        argv += ["--extra_llm_api_options", str(path)]
    return parse(argv)


def test_default_release_is_what_the_image_stands_for() -> None:
    assert release(None).name == "1.2.0"
    assert release("1.2.0rc2").name == "1.2.0" and release("1.3.0rc7").name == "1.3" and release("1.2").name == "1.2.0"
    # 1.3 is the row name (rc5-rc20); the version 1.3.0 is the final release, after rc20: no TensorRT backend
    assert release("1.3").version == "1.3.0rc20" and release("1.3.0rc20").name == "1.3"
    for later in ("1.3.0", "1.3.1", "1.3.1rc0", "1.3.0rc21"):
        assert release(later).name == "1.3.0rc21" and not release(later).tensorrt_backend and release(later).version == later
    for bad in ("", "two", "9.9.9", "1.2.0; rm -rf /"):
        with pytest.raises(ValueError, match="KVSIM_TRTLLM_RELEASE"):
            release(bad or "x")


@pytest.mark.parametrize("name", ["1.2.0", "1.2.1"])
def test_1_2_refuses_return_perf_metrics_on_tensorrt_as_trtllmargs_does(engine_dir, tmp_path, name) -> None:
    with pytest.raises(ServeError, match="'TrtLlmArgs' object has no attribute 'perf_metrics_max_requests'"):
        resolve(args(engine_dir, tmp_path, "return_perf_metrics: true\n"), env(name))
    with pytest.raises(ServeError, match="perf_metrics_max_requests: Extra inputs are not permitted"):
        resolve(args(engine_dir, tmp_path, "perf_metrics_max_requests: 100\n"), env(name))
    assert resolve(args(engine_dir, tmp_path, "return_perf_metrics: true\n"), env("1.3")).return_perf_metrics


def test_the_refusal_is_a_startup_failure_with_the_real_error_text(engine_dir, tmp_path, capsys, monkeypatch) -> None:
    for key, value in env("1.2.0").items():
        monkeypatch.setenv(key, value)
    (tmp_path / "x.yaml").write_text("return_perf_metrics: true\n")
    assert serve_main([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "8", "--max_num_tokens", "4096",
                       "--extra_llm_api_options", str(tmp_path / "x.yaml")]) == 1
    assert "AttributeError: 'TrtLlmArgs' object has no attribute 'perf_metrics_max_requests'" in capsys.readouterr().err


def test_waiting_queue_policy_only_from_1_3(engine_dir, tmp_path) -> None:
    text = "scheduler_config: {capacity_scheduler_policy: MAX_UTILIZATION, waiting_queue_policy: FCFS}\n"
    with pytest.raises(ServeError, match="scheduler_config.waiting_queue_policy: Extra inputs are not permitted"):
        resolve(args(engine_dir, tmp_path, text), env("1.2.0"))
    assert resolve(args(engine_dir, tmp_path, text), env("1.3")).engine.capacity_policy.value == "MAX_UTILIZATION"


def test_1_2_clamps_a_runtime_limit_above_the_engine_with_a_warning(engine_dir, tmp_path) -> None:
    s = resolve(args(engine_dir, tmp_path, None, "--max_batch_size", "256"), env("1.2.0"))
    assert s.engine.max_batch_size == 64
    assert s.warnings == ("max_batch_size [64] is overridden by build_config.max_batch_size [64] in build_config",)
    with pytest.raises(ServeError, match=r"max_batch_size \[256\] is greater than build_config.max_batch_size \[64\]"):
        resolve(args(engine_dir, tmp_path, None, "--max_batch_size", "256"), env("1.1"))


def test_an_unknown_release_does_not_start(engine_dir, tmp_path) -> None:
    with pytest.raises(ServeError, match="KVSIM_TRTLLM_RELEASE='0.9'"):
        resolve(args(engine_dir, tmp_path), env("0.9"))


def names(metrics: ServeMetrics) -> set[str]:
    """Family names (a labelled histogram has no samples before its first observation)."""
    return {f.name for f in text_string_to_metric_families(metrics.render().decode())}


@pytest.mark.parametrize("name", list(RELEASES))
def test_prometheus_names_per_release(engine_dir, tmp_path, name) -> None:
    rel = RELEASES[name]
    argv = args(engine_dir, tmp_path) if rel.tensorrt_backend else parse([str(engine_dir.parent / "ckpt")])
    settings = resolve(argv, env(name))
    metrics = ServeMetrics(Engine(settings.engine), "m", rel.prometheus_prefix, rel.iteration_gauges)
    got = names(metrics)
    p = rel.prometheus_prefix
    assert {f"{p}time_to_first_token_seconds", f"{p}time_per_output_token_seconds", f"{p}request_success",
            f"{p}e2e_request_latency_seconds", f"{p}request_queue_time_seconds"} <= got
    assert (f"{p}kv_cache_max_blocks" in got) is rel.iteration_gauges
    if not p:  # 1.x's collector: nothing prefixed, no gauges
        assert not any(n.startswith("trtllm_") for n in got) and "kv_cache_max_blocks" not in got


def test_the_engine_records_the_release_kvsim_plays(tmp_path, monkeypatch) -> None:
    import json

    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")])
    monkeypatch.setenv("KVSIM_TRTLLM_RELEASE", "1.3")
    assert build_main(["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "e")]) == 0
    assert json.loads((tmp_path / "e" / "config.json").read_text())["version"] == "1.3.0rc20"  # the 1.3 row (rc5-rc20) reports its last rc
    monkeypatch.setenv("KVSIM_TRTLLM_RELEASE", "nope")
    assert build_main(["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "f")]) == 1
