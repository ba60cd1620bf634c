"""trtllm-serve's command line, YAML precedence, environment and refusals (no server started)."""

from __future__ import annotations

import pytest
from kvsim.serve.args import parse
from kvsim.serve.cli import main as serve_main
from kvsim.serve.settings import ServeError, resolve
from kvsim.trtllm.build import main as build_main
from kvsim.trtllm.checkpoint import main as checkpoint_main

from tests.kvsim.helpers import BLOG_ONLY_FLAGS, flag

ENV = {"KVSIM_PROFILE": "llama-3.1-8b-fp8-h100"}
ENV_1_3 = {**ENV, "KVSIM_TRTLLM_RELEASE": "1.3"}  # return_perf_metrics works on TensorRT from 1.3 (PR #10662)


@pytest.fixture
def engine_dir(tmp_path):
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")])
    assert build_main(["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine"),
                       "--max_batch_size", "64", "--max_num_tokens", "4096", "--max_seq_len", "4096",
                       "--max_input_len", "3072", "--tokens_per_block", "64"]) == 0
    return tmp_path / "engine"


def yaml_file(tmp_path, text: str):
    path = tmp_path / "extra.yaml"
    path.write_text(text)
    return str(path)


def test_engine_limits_and_serve_defaults(engine_dir):
    s = resolve(parse([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "32", "--max_num_tokens", "4096"]),
                ENV)
    e = s.engine
    assert (e.build_max_batch_size, e.max_batch_size, e.max_seq_len, e.max_input_len, e.tokens_per_block) == (
        64, 32, 4096, 3072, 64)
    assert e.enable_batch_size_tuning and e.capacity_policy.value == "GUARANTEED_NO_EVICT"
    assert s.iter_perf_stats and not s.return_perf_metrics and s.model_id == "engine"


def test_default_max_batch_size_above_the_engine_is_refused_by_1_1(engine_dir, capsys, monkeypatch):
    monkeypatch.setenv("KVSIM_PROFILE", "llama-3.1-8b-fp8-h100")
    monkeypatch.setenv("KVSIM_TRTLLM_RELEASE", "1.1")
    assert serve_main([str(engine_dir), "--backend", "tensorrt", "--max_num_tokens", "4096"]) == 1
    err = capsys.readouterr().err
    assert "Value error, max_batch_size [2048] is greater than build_config.max_batch_size [64] in build_config" in err
    assert serve_main([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "64"]) == 1
    assert "max_num_tokens [8192] is greater than build_config.max_num_tokens [4096]" in capsys.readouterr().err


def test_yaml_overrides_cli_and_replaces_whole_sections(engine_dir, tmp_path):
    extra = yaml_file(tmp_path, """
max_batch_size: 16
return_perf_metrics: true
kv_cache_config: {enable_block_reuse: false}
scheduler_config: {capacity_scheduler_policy: MAX_UTILIZATION}
""")
    s = resolve(parse([str(engine_dir), "--backend", "trt", "--max_batch_size", "64", "--max_num_tokens", "4096",
                       "--kv_cache_free_gpu_memory_fraction", "0.5", "--extra_llm_api_options", extra]), ENV_1_3)
    e = s.engine
    assert e.max_batch_size == 16 and s.return_perf_metrics
    assert e.free_gpu_memory_fraction == 0.9  # the YAML section replaced the CLI's KvCacheConfig
    assert not e.enable_block_reuse
    assert e.capacity_policy.value == "MAX_UTILIZATION" and not e.enable_batch_size_tuning


def test_yaml_with_explicit_tuner_and_fraction(engine_dir, tmp_path):
    extra = yaml_file(tmp_path, """
kv_cache_config: {free_gpu_memory_fraction: 0.85}
scheduler_config:
  capacity_scheduler_policy: GUARANTEED_NO_EVICT
  dynamic_batch_config: {enable_batch_size_tuning: false, enable_max_num_tokens_tuning: false,
                         dynamic_batch_moving_average_window: 64}
""")
    s = resolve(parse([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "8", "--max_num_tokens", "1024",
                       "--config", extra]), ENV)
    assert s.engine.free_gpu_memory_fraction == 0.85 and not s.engine.enable_batch_size_tuning
    assert s.engine.max_num_tokens == 1024


@pytest.mark.parametrize("text, message", [
    ("max_bach_size: 8\n", "max_bach_size: Extra inputs are not permitted"),
    ("enable_iter_perf_stats: true\n", "enable_iter_perf_stats: Extra inputs are not permitted .TrtLlmArgs"),
    ("kv_cache_config: {fraction: 0.5}\n", "kv_cache_config.fraction"),
    ("scheduler_config: {dynamic_batch_config: {enable_batch_size_tuning: true}}\n", "Field required"),
    ("scheduler_config: {capacity_scheduler_policy: FASTEST}\n", "capacity_scheduler_policy"),
])
def test_bad_yaml_is_refused(engine_dir, tmp_path, text, message):
    with pytest.raises((ServeError, ValueError), match=message):
        resolve(parse([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "8", "--max_num_tokens", "1024",
                       "--extra_llm_api_options", yaml_file(tmp_path, text)]), ENV)


def test_profile_environment_is_required(engine_dir):
    args = parse([str(engine_dir), "--backend", "tensorrt", "--max_batch_size", "8", "--max_num_tokens", "1024"])
    with pytest.raises(ServeError, match="KVSIM_PROFILE is not set"):
        resolve(args, {})
    with pytest.raises(ServeError, match="not a usable profile"):
        resolve(args, {"KVSIM_PROFILE": "llama-3.1-8b-fp8-tpu"})
    with pytest.raises(ServeError, match="KVSIM_SPEEDUP"):
        resolve(args, {**ENV, "KVSIM_SPEEDUP": "0"})


def test_pytorch_backend_with_a_hugging_face_id_uses_the_profile_model():
    s = resolve(parse(["serve", "meta-llama/Llama-3.1-70B-Instruct", "--tp_size", "2", "--max_batch_size", "256",
                       "--max_seq_len", "8192"]), {"KVSIM_PROFILE": "llama-3.1-70b-fp8-h100-tp2"})
    e = s.engine
    assert e.profile.tp == 2 and e.profile.model.name == "llama-3.1-70b"
    assert (e.max_batch_size, e.build_max_batch_size, e.max_seq_len) == (256, 256, 8192)
    assert not s.iter_perf_stats  # the PyTorch backend needs enable_iter_perf_stats for /metrics


def test_engine_dir_needs_the_tensorrt_backend(engine_dir):
    with pytest.raises(ServeError, match="--backend tensorrt"):
        resolve(parse([str(engine_dir)]), ENV)


def test_unknown_options_are_rejected_like_click(capsys):
    with pytest.raises(SystemExit) as info:
        parse(["model", "--max_batch_size", "8", flag(BLOG_ONLY_FLAGS[0])])
    assert info.value.code == 2
    assert f"Error: No such option: {flag(BLOG_ONLY_FLAGS[0])}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse([])
    assert "Missing argument 'MODEL'" in capsys.readouterr().err


def test_pytorch_backend_accepts_its_own_keys(tmp_path):
    extra = yaml_file(tmp_path, "enable_iter_perf_stats: true\nprint_iter_log: false\n"
                                "kv_cache_config: {dtype: fp8, tokens_per_block: 64}\n")
    s = resolve(parse(["meta-llama/Llama-3.1-8B-Instruct", "--max_batch_size", "32", "--config", extra]), ENV)
    assert s.iter_perf_stats and s.engine.tokens_per_block == 64


def test_an_engine_that_does_not_fit_the_gpu_is_refused(tmp_path):
    checkpoint_main(["--profile", "llama-3.1-70b-bf16-h100-tp4", "--output_dir", str(tmp_path / "ckpt"),
                     "--tp_size", "1"])
    assert build_main(["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine"),
                       "--max_batch_size", "8", "--max_num_tokens", "1024"]) == 0
    args = parse([str(tmp_path / "engine"), "--backend", "tensorrt", "--max_batch_size", "8", "--max_num_tokens", "1024"])
    with pytest.raises(ServeError, match="do not fit"):
        resolve(args, ENV)  # a 70B BF16 engine (141 GB of weights) on one 80 GB H100


def _no_server(monkeypatch):
    """A config that is wrongly accepted must fail the test, not start a server that never returns."""
    import socket
    import types

    import kvsim.serve.cli as serve_cli

    def refuse(*_args, **_kwargs):
        raise AssertionError("trtllm-serve accepted the input and went on to open its socket")

    fake = types.SimpleNamespace(socket=refuse, AF_INET=socket.AF_INET, AF_INET6=socket.AF_INET6,
                                 SOCK_STREAM=socket.SOCK_STREAM)
    monkeypatch.setattr(serve_cli, "socket", fake)  # this module's name only: nothing else loses its sockets


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc.update(build_config=3), "build_config must be a JSON object, got int"),
    (lambda doc: doc["build_config"].update(max_batch_size="x"), "max_batch_size must be a positive integer, got 'x'"),
    (lambda doc: doc["build_config"].update(plugin_config=[]), "build_config.plugin_config must be a JSON object"),
    (lambda doc: doc["pretrained_config"].update(mapping=[]), "pretrained_config.mapping must be a JSON object"),
    (lambda doc: doc["pretrained_config"].update(quantization="FP8"), "quantization must be a JSON object"),
    (lambda doc: doc["pretrained_config"].pop("num_attention_heads"), "lacks num_attention_heads"),
    (lambda doc: doc["pretrained_config"].update(mapping={"tp_size": "two"}), "tp_size must be a positive integer"),
])
def test_a_hand_edited_engine_config_is_one_error_line(engine_dir, capsys, monkeypatch, edit, message):
    import json

    _no_server(monkeypatch)

    doc = json.loads((engine_dir / "config.json").read_text())
    edit(doc)
    (engine_dir / "config.json").write_text(json.dumps(doc))
    monkeypatch.setenv("KVSIM_PROFILE", "llama-3.1-8b-fp8-h100")
    assert serve_main([str(engine_dir), "--backend", "tensorrt"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {engine_dir / 'config.json'}") and message in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("text, message", [("{bad", "is not JSON"), ("[]", "must hold a JSON object, got list"),
                                           ('{"architecture": 1}', "lacks num_hidden_layers")])
def test_a_bad_checkpoint_config_beside_an_hf_model_is_one_error_line(tmp_path, capsys, monkeypatch, text, message):
    (tmp_path / "config.json").write_text(text)
    monkeypatch.setenv("KVSIM_PROFILE", "llama-3.1-8b-fp8-h100")
    _no_server(monkeypatch)
    assert serve_main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert message in err and str(tmp_path / "config.json") in err and "Traceback" not in err


def test_extra_options_that_are_not_yaml_are_named(engine_dir, tmp_path):
    path = yaml_file(tmp_path, "kv_cache_config: [")
    with pytest.raises(ServeError, match=r"extra.yaml is not readable YAML: .* at line 1, column"):
        resolve(parse([str(engine_dir), "--backend", "tensorrt", "--extra_llm_api_options", path]), ENV)
