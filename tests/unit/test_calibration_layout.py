"""The calibration-set layout quantize.py reads is checked in the build Job before hours of work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvpilot.trtllm.build_script import build_script
from kvpilot.trtllm.calibration import CHECK_PY, preflight_lines
from tests.unit.helpers import engine


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHECK_PY, str(path)], capture_output=True, text=True, timeout=60)


def test_cnn_dailymail_needs_its_3_0_0_config(tmp_path: Path) -> None:
    repo = tmp_path / "datasets" / "cnn_dailymail"
    (repo / "1.0.0").mkdir(parents=True)
    (repo / "1.0.0" / "train-00000-of-00003.parquet").write_bytes(b"x")
    bad = check(repo)
    assert bad.returncode == 3 and "3.0.0 config" in bad.stderr and "spec.build.calibration.dataset" in bad.stderr
    (repo / "3.0.0").mkdir()
    (repo / "3.0.0" / "train-00000-of-00003.parquet").write_bytes(b"x")
    assert check(repo).returncode == 0


def test_a_local_dataset_needs_a_train_split(tmp_path: Path) -> None:
    local = tmp_path / "my-calib"
    local.mkdir()
    (local / "validation.jsonl").write_text("{}")
    bad = check(local)
    assert bad.returncode == 3 and "train split" in bad.stderr and "'text' column" in bad.stderr
    (local / "data").mkdir()
    (local / "data" / "train.jsonl").write_text('{"text": "x"}')
    assert check(local).returncode == 0
    assert check(tmp_path / "missing").returncode == 3


def test_the_check_runs_only_for_a_local_set_that_is_calibrated_from() -> None:
    on_claim = engine("tensorrt", build={"quantization": "fp8", "calibration": {"dataset": "pvc://models/datasets/cnn_dailymail"}})
    (line,) = preflight_lines(on_claim.spec)
    assert line.endswith("/calibration/datasets/cnn_dailymail")
    assert line in build_script(on_claim.spec, "f" * 64, "img:1.2.0", 64)
    assert preflight_lines(engine("tensorrt", build={"quantization": "fp8"}).spec) == []  # a Hub name
    assert preflight_lines(engine("simulated", build={"quantization": "fp8"}).spec) == []
