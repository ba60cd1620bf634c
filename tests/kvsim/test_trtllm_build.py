"""kvsim checkpoint + kvsim trtllm-build: TensorRT-LLM's command line, its refusals, and the engine dir it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from kvsim.profiles import PROFILES
from kvsim.trtllm.build import main as build_main
from kvsim.trtllm.checkpoint import main as checkpoint_main
from kvsim.trtllm.engine_dir import is_engine_dir, load_engine_dir

from tests.kvsim.helpers import BLOG_ONLY_FLAGS
from tests.kvsim.helpers import flag as dashed


@pytest.fixture
def checkpoint(tmp_path):
    assert checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")]) == 0
    return tmp_path / "ckpt"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_checkpoint_has_trtllm_pretrained_config_fields(tmp_path, name):
    assert checkpoint_main(["--profile", name, "--output_dir", str(tmp_path)]) == 0
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("architecture", "dtype", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "hidden_size", "vocab_size", "max_position_embeddings", "mapping", "quantization"):
        assert key in cfg
    assert cfg["mapping"]["tp_size"] == PROFILES[name].tp
    assert cfg["quantization"]["quant_algo"] == ("FP8" if "-fp8-" in name else None)


def test_checkpoint_tp_override_and_unknown_profile(tmp_path, capsys):
    assert checkpoint_main(["--profile", "llama-3.1-70b-fp8-h100-tp4", "--output_dir", str(tmp_path),
                            "--tp_size", "8", "--pp_size", "2"]) == 0
    assert json.loads((tmp_path / "config.json").read_text())["mapping"] == {
        "world_size": 16, "tp_size": 8, "pp_size": 2, "cp_size": 1}
    assert checkpoint_main(["--profile", "gpt-9-fp8-h100", "--output_dir", str(tmp_path)]) == 1
    assert "unknown model" in capsys.readouterr().err


def test_build_writes_a_trtllm_shaped_engine_dir(checkpoint, tmp_path):
    out = tmp_path / "engine"
    rc = build_main(["--checkpoint_dir", str(checkpoint), "--output_dir", str(out), "--max_batch_size", "64",
                     "--max_input_len", "2048", "--max_seq_len", "2560", "--max_beam_width", "1",
                     "--max_num_tokens", "8192", "--kv_cache_type", "paged", "--tokens_per_block", "16",
                     "--gemm_plugin", "auto", "--use_paged_context_fmha", "enable", "--multiple_profiles", "enable"])
    assert rc == 0
    doc = json.loads((out / "config.json").read_text())
    assert {"version", "pretrained_config", "build_config"} <= doc.keys()
    build = doc["build_config"]
    assert (build["max_batch_size"], build["max_input_len"], build["max_seq_len"], build["max_num_tokens"]) == (
        64, 2048, 2560, 8192)
    assert build["kv_cache_type"] == "PAGED" and build["max_beam_width"] == 1 and build["opt_num_tokens"] is None
    plugin = build["plugin_config"]
    assert plugin["tokens_per_block"] == 16 and plugin["use_paged_context_fmha"] is True
    assert plugin["remove_input_padding"] is True and plugin["gpt_attention_plugin"] == "bfloat16"
    assert plugin["gemm_plugin"] == "bfloat16" and plugin["multiple_profiles"] is True
    ranks = sorted(p.name for p in out.glob("rank*.engine"))
    assert ranks == ["rank0.engine"] and (out / "rank0.engine").stat().st_size < 64
    engine = load_engine_dir(out)
    assert is_engine_dir(out) and engine.max_batch_size == 64 and engine.tokens_per_block == 16
    assert engine.dtype == "fp8" and engine.model.name == "llama-3.1-8b"


def test_build_defaults_and_deduced_limits(checkpoint, tmp_path):
    out = tmp_path / "engine"
    assert build_main(["--model_config", str(checkpoint / "config.json"), "--output_dir", str(out),
                       "--max_batch_size", "2", "--max_num_tokens", "500000"]) == 0
    build = json.loads((out / "config.json").read_text())["build_config"]
    assert build["max_seq_len"] == 131072 and build["max_input_len"] == 1024
    assert build["max_num_tokens"] == 2 * 131072 and build["opt_num_tokens"] == 2  # clamped to bs x seq_len
    assert build["plugin_config"]["tokens_per_block"] == 32 and build["plugin_config"]["gemm_plugin"] is None


@pytest.mark.parametrize("flag", [[dashed(BLOG_ONLY_FLAGS[0])], [dashed(BLOG_ONLY_FLAGS[1])],
                                  [dashed(BLOG_ONLY_FLAGS[2]), "16"], ["--max_output_len", "512"],
                                  ["--model_dir", "x"], ["--multiple_profiles"], ["--tp_size", "2"],
                                  ["--remove_input_padding", "true"], ["--kv_cache_type", "blocks"]])
def test_flags_trtllm_build_does_not_have_are_rejected(checkpoint, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_main(["--checkpoint_dir", str(checkpoint)] + flag)
    assert exit_info.value.code == 2
    assert "trtllm-build: error:" in capsys.readouterr().err


def test_refusals_exit_one_with_reason(checkpoint, tmp_path, capsys):
    base = ["--checkpoint_dir", str(checkpoint), "--output_dir", str(tmp_path / "e")]
    assert build_main(base + ["--multiple_profiles", "enable", "--opt_num_tokens", "64"]) == 1
    assert "opt_num_tokens" in capsys.readouterr().err
    assert build_main(base + ["--tokens_per_block", "24"]) == 1
    assert "power of two" in capsys.readouterr().err
    assert build_main(["--output_dir", str(tmp_path / "e")]) == 1
    assert "--checkpoint_dir" in capsys.readouterr().err
    assert not (tmp_path / "e" / "config.json").exists()


def test_failure_injection_and_build_time(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSIM_FAIL_BUILD", "simulated: CUDA error: out of memory")
    assert build_main(["--checkpoint_dir", str(checkpoint), "--output_dir", str(tmp_path / "e")]) == 1
    assert "simulated: CUDA error: out of memory" in capsys.readouterr().err
    monkeypatch.delenv("KVSIM_FAIL_BUILD")
    monkeypatch.setenv("KVSIM_BUILD_SECONDS", "0.3")
    started = time.monotonic()
    assert build_main(["--checkpoint_dir", str(checkpoint), "--output_dir", str(tmp_path / "e")]) == 0
    assert time.monotonic() - started >= 0.3


def test_console_script_dispatches_to_trtllm_build(checkpoint, tmp_path):
    kvsim = os.path.join(os.path.dirname(sys.executable), "kvsim")
    proc = subprocess.run([kvsim, "trtllm-build", "--checkpoint_dir", str(checkpoint), "--output_dir",
                           str(tmp_path / "e"), "--max_batch_size", "128"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert load_engine_dir(tmp_path / "e").max_batch_size == 128


@pytest.mark.parametrize("text, message", [
    ("{bad", "is not JSON"),
    ("", "is empty; it must hold a JSON object"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ("{}", "checkpoint config.json lacks architecture"),
    ('{"architecture": "A", "num_hidden_layers": "many", "num_attention_heads": 8, "hidden_size": 64, '
     '"vocab_size": 10}', "num_hidden_layers must be a positive integer, got 'many'"),
    ('{"architecture": "A", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 64, '
     '"vocab_size": 10, "mapping": [2]}', "mapping must be a JSON object"),
])
def test_a_bad_checkpoint_config_is_one_error_line(tmp_path, capsys, text, message):
    path = tmp_path / "model.json"
    path.write_text(text)
    assert build_main(["--model_config", str(path), "--output_dir", str(tmp_path / "e")]) == 1
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("[TensorRT-LLM][ERROR] ")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("text, message", [
    ("{bad", "--build_config file {path} is not JSON"),
    ("", "--build_config file {path} is empty"),
    ('["max_batch_size", 8]', "--build_config file {path} must hold a JSON object, got list"),
    ('{"max_batch_size": "lots"}', "build_config.max_batch_size must be a positive integer, got 'lots'"),
    ('{"max_num_tokens": 0}', "build_config.max_num_tokens must be a positive integer, got 0"),
    (None, "--build_config file {path} cannot be read: No such file"),
])
def test_a_bad_build_config_file_is_one_error_line(checkpoint, tmp_path, capsys, text, message):
    path = tmp_path / "build.json"
    if text is not None:
        path.write_text(text)
    args = ["--checkpoint_dir", str(checkpoint), "--build_config", str(path), "--output_dir", str(tmp_path / "e")]
    assert build_main(args) == 1
    err = capsys.readouterr().err
    assert message.format(path=path) in err and "Traceback" not in err and err.count("\n") == 1


def test_a_build_config_file_sets_limits(checkpoint, tmp_path):
    path = tmp_path / "build.json"
    path.write_text('{"max_batch_size": 48, "max_seq_len": 4096}')
    args = ["--checkpoint_dir", str(checkpoint), "--build_config", str(path), "--output_dir", str(tmp_path / "e")]
    assert build_main(args) == 0
    engine = load_engine_dir(tmp_path / "e")
    assert (engine.max_batch_size, engine.max_seq_len) == (48, 4096)


@pytest.mark.parametrize("text", ['"build_config"', "3", "[\"build_config\"]", "{bad"])
def test_only_a_json_object_with_a_build_config_is_an_engine_dir(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    assert not is_engine_dir(tmp_path)


def test_a_config_integer_that_is_infinite_fractional_or_huge_is_one_error_naming_the_field() -> None:
    import pytest

    from kvsim.trtllm.checkpoint import config_int

    for bad in (float("inf"), float("nan"), 2.7, 1e30, 2 ** 63):
        with pytest.raises(ValueError, match="num_layers must be a positive integer"):
            config_int({"num_layers": bad}, "num_layers", "config.json")
    assert config_int({"num_layers": 32.0}, "num_layers", "config.json") == 32
