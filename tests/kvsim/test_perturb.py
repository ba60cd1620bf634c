"""A perturbed engine (kvsim.perturb, KVSIM_PERTURB): each factor moves the engine in the stated direction, and
hostile text is refused with one line naming the variable and the key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kvsim.bench import bench_throughput
from kvsim.engine import Engine
from kvsim.memory import plan_memory
from kvsim.perturb import Perturbation, PerturbationError
from kvsim.profiles import get_profile
from kvsim.serve.args import parse
from kvsim.serve.settings import resolve
from kvsim.trtllm.checkpoint import main as checkpoint_main

from tests.kvsim.helpers import small_config

PROFILE = get_profile("llama-3.1-8b-fp8-h100")


def throughput(text: str, isl: int, osl: int, n: int = 300) -> float:
    return bench_throughput(Perturbation.parse(text).apply(PROFILE), isl, osl, num_requests=n).output_tokens_per_s


def test_identity_is_the_profile_itself_and_text_round_trips() -> None:
    assert Perturbation.parse("").apply(PROFILE) is PROFILE
    assert Perturbation.from_env({}).is_identity and Perturbation.from_env({"KVSIM_PERTURB": ""}).is_identity
    p = Perturbation.parse(" decode = 0.8, prefill=1.1,overhead=1.5,per_seq=1.5,memory=0.9 ")
    assert (p.decode, p.prefill, p.overhead, p.per_seq, p.memory) == (0.8, 1.1, 1.5, 1.5, 0.9)
    assert Perturbation.parse(p.to_text()) == p
    assert Perturbation(memory=0.9).to_text() == "memory=0.9"


def test_each_factor_multiplies_its_parameter() -> None:
    cal, out = PROFILE.calibration, Perturbation(0.8, 1.1, 1.5, 2.0, 0.9).apply(PROFILE)
    assert out.calibration.hbm_efficiency == pytest.approx(cal.hbm_efficiency * 0.8)
    assert out.calibration.prefill_mfu == pytest.approx(cal.prefill_mfu * 1.1)
    assert out.calibration.step_overhead_s == pytest.approx(cal.step_overhead_s * 1.5)
    assert out.calibration.per_sequence_s == pytest.approx(cal.per_sequence_s * 2.0)
    assert out.gpu.memory_bytes == int(PROFILE.gpu.memory_bytes * 0.9)
    assert out.name == PROFILE.name and out.model == PROFILE.model
    assert PROFILE.calibration == cal  # the nominal profile is untouched


@pytest.mark.parametrize("text,isl,osl,faster", [
    ("decode=0.8", 128, 2048, False), ("decode=1.25", 128, 2048, True),  # decode-heavy row
    ("prefill=0.8", 2048, 128, False), ("prefill=1.25", 2048, 128, True),  # prefill-heavy row
    ("overhead=2", 128, 128, False), ("overhead=0.5", 128, 128, True),
    ("per_seq=2", 128, 128, False), ("per_seq=0.5", 128, 128, True),
])
def test_bench_throughput_moves_in_the_stated_direction(text, isl, osl, faster) -> None:
    nominal, perturbed = throughput("", isl, osl), throughput(text, isl, osl)
    assert (perturbed > nominal * 1.005) if faster else (perturbed < nominal * 0.995), (text, nominal, perturbed)


def test_decode_factor_scales_the_memory_bound_part_of_a_step() -> None:
    """One decode step at batch 8: its bandwidth-bound part takes 1/0.8 as long, the rest is unchanged."""
    def step(text: str) -> tuple[float, float]:
        e = Engine(small_config(profile=Perturbation.parse(text).apply(PROFILE)), epoch_s=0.0)
        m = e.model
        return m.iteration_s(8, 8000, []), m.step_s + m.per_seq_s * 8

    (t0, fixed0), (t1, fixed1) = step(""), step("decode=0.8")
    assert fixed0 == fixed1 and (t1 - fixed1) == pytest.approx((t0 - fixed0) / 0.8)


def test_memory_factor_shrinks_and_grows_the_kv_pool() -> None:
    blocks = {m: plan_memory(Perturbation(memory=m).apply(PROFILE), 2048, 8192, 32, 0.9).num_blocks
              for m in (0.7, 0.9, 1.0, 1.3)}
    assert blocks[0.7] < blocks[0.9] < blocks[1.0] < blocks[1.3]
    # the fixed costs (weights, activations) stay: the pool loses more than the memory does
    assert blocks[0.9] / blocks[1.0] < 0.9
    assert bench_throughput(Perturbation(memory=0.7).apply(PROFILE), 1000, 1000, 1500).kv_blocks < \
        bench_throughput(PROFILE, 1000, 1000, 1500).kv_blocks


HOSTILE = [
    ("decod=0.8", "unknown key 'decod'"), ("decode=nan", "decode=nan is not a finite number"),
    ("decode=inf", "not a finite number"), ("memory=1e400", "not a finite number"),
    ("decode=-1", "outside [0.25, 4]"), ("prefill=0.1", "prefill=0.1 is outside"), ("overhead=4.5", "outside"),
    ("per_seq=0", "outside"), ("decode=0.8,decode=0.9", "key decode is given twice"),
    ("decode", "is not key=factor"), ("decode=", "is not a number"), ("decode=0x1p-1", "is not a number"),
    ("decode=0.8,,memory=1", "an empty item"), ("decode=0.8;rm -rf /", "is not a number"),
    ("decode=0.8\nmemory=0.5", "is not a number"), ("=1", "unknown key ''"), ("x" * 300, "at most 256"),
    ("décode=1", "unknown key 'd\\xe9code'"),
]


@pytest.mark.parametrize("text,why", HOSTILE)
def test_hostile_text_is_refused_with_one_line_naming_variable_and_key(text, why) -> None:
    with pytest.raises(PerturbationError) as info:
        Perturbation.from_env({"KVSIM_PERTURB": text})
    message = str(info.value)
    assert message.startswith("KVSIM_PERTURB") and why in message and "\n" not in message


@pytest.mark.parametrize("bad", [float("nan"), 0.2, 5, True, "0.8"])
def test_the_api_refuses_what_the_parser_refuses(bad) -> None:
    with pytest.raises(PerturbationError, match="decode"):
        Perturbation(decode=bad)


def test_trtllm_serve_plays_the_perturbed_engine(tmp_path) -> None:
    """What a pod's environment sets reaches the engine that serves: a slower calibration, a smaller pool."""
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")])
    argv = [str(tmp_path / "ckpt"), "--max_batch_size", "64", "--max_seq_len", "8192"]
    env = {"KVSIM_PROFILE": "llama-3.1-8b-fp8-h100"}
    nominal = resolve(parse(argv), env)
    slow = resolve(parse(argv), {**env, "KVSIM_PERTURB": "decode=0.8,per_seq=1.5,memory=0.9"})
    assert nominal.perturbation.is_identity and slow.perturbation == Perturbation(decode=0.8, per_seq=1.5, memory=0.9)
    e_nominal, e_slow = Engine(nominal.engine, epoch_s=0.0), Engine(slow.engine, epoch_s=0.0)
    assert e_slow.memory.num_blocks < e_nominal.memory.num_blocks
    assert e_slow.model.iteration_s(64, 64 * 1000, []) > e_nominal.model.iteration_s(64, 64 * 1000, [])


def run_kvsim(args: list[str], perturb: str, tmp_path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "KVSIM_PROFILE": "llama-3.1-8b-fp8-h100", "KVSIM_PERTURB": perturb}
    return subprocess.run([sys.executable, "-m", "kvsim.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("command", ["trtllm-serve", "trtllm-build"])
def test_commands_exit_2_with_one_line_and_no_traceback(tmp_path, command) -> None:
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")])
    args = [command, str(tmp_path / "ckpt")] if command == "trtllm-serve" else \
        [command, "--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine")]
    done = run_kvsim(args, "decode=0.8,speed=2", tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KVSIM_PERTURB" in lines[0] and "'speed'" in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_trtllm_build_records_the_perturbation(tmp_path) -> None:
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(tmp_path / "ckpt")])
    done = run_kvsim(["trtllm-build", "--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir",
                      str(tmp_path / "engine")], "memory=0.9, decode=0.8", tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "engine" / "config.json").read_text())["kvsim"]
    assert record["perturbation"] == "decode=0.8,memory=0.9"


def test_kvsim_bench_takes_the_same_text(capsys) -> None:
    from kvsim.cli import main

    assert main(["bench-throughput", "--isl", "128", "--osl", "128", "--num-requests", "200", "--json"]) == 0
    nominal = json.loads(capsys.readouterr().out)["outputTokensPerSecond"]
    assert main(["bench-throughput", "--isl", "128", "--osl", "128", "--num-requests", "200", "--json",
                 "--perturb", "overhead=2"]) == 0
    assert json.loads(capsys.readouterr().out)["outputTokensPerSecond"] < nominal
    assert main(["bench-throughput", "--isl", "128", "--osl", "128", "--perturb", "warp=2"]) == 2
    assert "--perturb: unknown key 'warp'" in capsys.readouterr().err
