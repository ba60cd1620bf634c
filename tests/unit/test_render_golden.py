"""Golden manifests: `kvpilot render` of every example, compared with tests/golden/ (UPDATE_GOLDEN=1 rewrites)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot.cli import load_engines, render
from kvpilot.desired.settings import Settings

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_matches_golden(example: Path) -> None:
    out = render(load_engines(str(example)), Settings(kvsim_image="ghcr.io/kvpilot/kvsim:0.1.0"), True)
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no golden file for {example.name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert out == golden.read_text()


def test_render_cli_rejects_invalid_input_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples/simulated.yaml").read_text().replace("maxBatchSize: 64", "maxBatchSize: 4096"))
    proc = subprocess.run([sys.executable, "-m", "kvpilot.cli", "render", "-f", str(bad)], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert 'InferenceEngine "sim-llama-8b" is invalid' in proc.stderr
    assert "spec.batching.maxBatchSize" in proc.stderr and "must be <= build.maxBatchSize" in proc.stderr


def test_every_command_has_help() -> None:
    for args in (["--help"], ["run", "--help"], ["render", "--help"], ["crd", "--help"], ["bench", "tuner", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "kvpilot.cli", *args], capture_output=True, text=True)
        assert proc.returncode == 0 and "usage:" in proc.stdout, args
