"""kvsim's PyTorch trtllm-serve at start: the per-pod download of an HF id, and the kernel autotuner's warm-up,
which loads and saves its cache at TLLM_AUTOTUNER_CACHE_PATH as TensorRT-LLM's autotuner does (serve/warmup.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kvsim.serve.args import parse
from kvsim.serve.settings import ServeError, resolve
from kvsim.serve.warmup import (
    AUTOTUNE_SECONDS_PER_BUCKET,
    DOWNLOAD_BYTES_PER_S,
    AutotuneCacheError,
    autotune,
    start,
    token_buckets,
    warmup_tokens,
)
from kvsim.trtllm.checkpoint import main as checkpoint_main
from kvsim.trtllm.prepare import main as prepare_main

PROFILE = "llama-3.1-8b-fp8-h100"
KVSIM = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "kvsim")


def test_the_token_buckets_are_powers_of_two_up_to_the_next_one() -> None:
    assert token_buckets(8192) == tuple(2**i for i in range(14))
    assert token_buckets(5000) == token_buckets(8192)  # next_positive_power_of_2(5000) = 8192
    assert token_buckets(1) == (1,) and token_buckets(2) == (1, 2) and token_buckets(3) == (1, 2, 4)
    assert warmup_tokens(8192, 256, 4096, 10**6) == 8192  # max_num_tokens binds
    assert warmup_tokens(8192, 1, 4096, 10**6) == 4095  # batch_size * (max_seq_len - 1)
    assert warmup_tokens(8192, 256, 4096, 3000) == 3000  # the tokens the KV pool holds


def test_without_a_cache_path_everything_is_tuned_and_nothing_written(tmp_path: Path) -> None:
    run = autotune(8192, 1, None, "1.4.0rc1", "H100")
    assert (run.tuned, run.cached, run.seconds) == (14, 0, 14 * AUTOTUNE_SECONDS_PER_BUCKET)
    assert not list(tmp_path.iterdir())


def test_the_cache_is_saved_then_loaded_and_only_new_shapes_are_tuned(tmp_path: Path) -> None:
    path = tmp_path / "warm" / "autotuner.json"  # the parent is created, as save_cache does
    first = autotune(4096, 2, str(path), "1.4.0rc1", "H100")
    assert (first.tuned, first.cached) == (13, 0)
    saved = json.loads(path.read_text())
    assert saved["metadata"]["lib_version"] == "1.4.0rc1" and len(saved["rank_0"]) == len(saved["rank_1"]) == 13
    again = autotune(4096, 2, str(path), "1.4.0rc1", "H100")
    assert (again.tuned, again.cached, again.seconds) == (0, 13, 0.0)
    assert f"[Autotuner] Loading cache from {path}" in again.log
    more = autotune(8192, 2, str(path), "1.4.0rc1", "H100")  # a larger max_num_tokens adds one bucket
    assert (more.tuned, more.cached) == (1, 13) and len(json.loads(path.read_text())["rank_0"]) == 14


def test_what_kvsim_prepare_writes_is_filled_by_the_warm_up_and_foreign_entries_survive(tmp_path: Path) -> None:
    assert prepare_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt"),
                         "--warmup_dir", str(tmp_path / "warmup")]) == 0
    path = tmp_path / "warmup" / "autotuner.json"
    content = json.loads(path.read_text())
    content["rank_0"]["('trtllm::fp8_gemm', 'Runner', '()', ((8192, 4096),))"] = {"runner_id": 1, "tactic": "7",
                                                                                  "min_time": 0.01}
    path.write_text(json.dumps(content))
    assert autotune(8192, 1, str(path), "1.4.0rc1", "H100").tuned == 14  # prepare's sections are empty
    kept = json.loads(path.read_text())
    assert kept["rank_0"]["('trtllm::fp8_gemm', 'Runner', '()', ((8192, 4096),))"]["tactic"] == "7"
    assert kept["metadata"]["producer"] == "kvsim" and autotune(8192, 1, str(path), "1.4.0rc1", "H100").tuned == 0


@pytest.mark.parametrize("content,why", [
    ("not json", "Failed to load cache with JSON"), ("[1, 2]", "no 'metadata' object"),
    ('{"metadata": {}, "rank_0": {}}', "Rank 1 cache not found"), ('{"metadata": {}, "rank_0": [], "rank_1": {}}',
                                                                   "Rank 0 cache not found"),
    ("[" * 100000 + "]" * 100000, "Failed to load cache with JSON"),
])
def test_a_cache_the_real_autotuner_cannot_load_stops_the_start(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "autotuner.json"
    path.write_text(content)
    with pytest.raises(AutotuneCacheError, match=why):
        autotune(8192, 2, str(path), "1.4.0rc1", "H100")


def test_a_cache_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")  # the parent cannot be created (a read-only mount fails the same way)
    with pytest.raises(AutotuneCacheError, match="Failed to save cache with JSON"):
        autotune(8192, 1, str(tmp_path / "not-a-dir" / "autotuner.json"), "1.4.0rc1", "H100")


def test_a_cache_path_that_is_a_directory_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(AutotuneCacheError, match="Failed to"):
        autotune(8192, 1, str(tmp_path), "1.4.0rc1", "H100")


def settings_for(model: str, tmp_path: Path, yaml_text: str = "") -> object:
    (tmp_path / "extra.yaml").write_text(yaml_text or "enable_iter_perf_stats: true\n")
    env = {"KVSIM_PROFILE": PROFILE, "KVSIM_TRTLLM_RELEASE": "1.4", "KVSIM_SPEEDUP": "10"}
    argv = [model, "--backend", "pytorch", "--max_batch_size", "64", "--max_seq_len", "4096",
            "--extra_llm_api_options", str(tmp_path / "extra.yaml")]
    return resolve(parse(argv), env)


def simulated_start(settings: object, env: dict[str, str]) -> tuple[list[float], list[str]]:
    slept: list[float] = []
    lines: list[str] = []
    start(settings, env, lines.append, slept.append)
    return slept, lines


def test_an_hf_id_is_downloaded_by_the_pod_and_a_prepared_checkpoint_is_not(tmp_path: Path) -> None:
    hf = settings_for("meta-llama/Llama-3.1-8B-Instruct", tmp_path)
    slept, lines = simulated_start(hf, {})
    download = 9.08e9 / DOWNLOAD_BYTES_PER_S
    assert slept[0] == pytest.approx(download / 10, rel=0.01) and "kvsim downloads" in lines[0]
    assert slept[-1] == pytest.approx(14 * AUTOTUNE_SECONDS_PER_BUCKET / 10)  # no cache: everything tuned
    checkpoint_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt")])
    prepared = settings_for(str(tmp_path / "ckpt"), tmp_path)
    env = {"TLLM_AUTOTUNER_CACHE_PATH": str(tmp_path / "warm.json")}
    simulated_start(prepared, env)  # the prepare Job's warm-up fills the cache
    slept, lines = simulated_start(prepared, env)
    assert not any("downloads" in line for line in lines) and slept == [0.0, 0.0]  # load 0 s, nothing tuned
    assert any("0 token buckets tuned, 14 from the cache" in line for line in lines)


def test_enable_autotuner_false_skips_the_warm_up_and_the_cache(tmp_path: Path) -> None:
    checkpoint_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt")])
    off = settings_for(str(tmp_path / "ckpt"), tmp_path, "enable_autotuner: false\n")
    slept, _ = simulated_start(off, {"TLLM_AUTOTUNER_CACHE_PATH": str(tmp_path / "warm.json")})
    assert slept == [0.0] and not (tmp_path / "warm.json").exists()
    with pytest.raises(ServeError, match="enable_autotuner: Input should be a valid boolean"):
        settings_for(str(tmp_path / "ckpt"), tmp_path, "enable_autotuner: maybe\n")


def test_the_real_command_refuses_to_start_on_a_cache_it_cannot_load(tmp_path: Path) -> None:
    checkpoint_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt")])
    (tmp_path / "bad.json").write_text('{"metadata": {}}')
    t0 = time.monotonic()
    proc = subprocess.run([KVSIM, "trtllm-serve", str(tmp_path / "ckpt"), "--port", "0", "--max_batch_size", "8"],
                          env={**os.environ, "KVSIM_PROFILE": PROFILE, "KVSIM_TRTLLM_RELEASE": "1.4",
                               "TLLM_AUTOTUNER_CACHE_PATH": str(tmp_path / "bad.json")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Rank 0 cache not found" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 30
