"""``kvpilot bench tuner``: bad flags and bad workload files are one line naming the flag (exit 2), checked
before minutes of simulation, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot.cli import main

GOOD = ["bench", "tuner", "--workload", "chat", "--profile", "llama-3.1-8b-fp8-h100", "--slo-ttft-ms", "1000",
        "--slo-tpot-ms", "50", "--duration-seconds", "5"]


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Replace the simulation itself: these tests are about what is refused before it would start."""
    import kvpilot.bench.tuner as tuner

    ran: list[object] = []

    def fake_main(args: object) -> int:
        ran.append(args)
        return 0

    monkeypatch.setattr(tuner, "main", fake_main)
    return ran


@pytest.mark.parametrize(("extra", "message"), [
    (["--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--restart-seconds", "-5"], "--restart-seconds must be >= 0, got -5"),
    (["--ceiling", "0"], "--ceiling must be >= 1, got 0"),
    (["--rate-scale", "0"], "--rate-scale must be > 0, got 0"),
    (["--duration-seconds", "-1"], "--duration-seconds must be > 0, got -1"),
    (["--slo-tpot-ms", "nan"], "--slo-tpot-ms must be > 0, got nan"),
    (["--profile", "nonsense"], "--profile: profile name 'nonsense' must look like"),
    (["--workload", "no-such-bundle"], "--workload: workload 'no-such-bundle' is neither a file nor bundled"),
])
def test_bad_flags_are_refused_before_the_simulation(
    capsys: pytest.CaptureFixture[str], no_simulation: list[object], extra: list[str], message: str,
) -> None:
    assert main(GOOD + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvpilot bench tuner: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert no_simulation == []


@pytest.mark.parametrize(("text", "message"), [
    ("a: [", "is not YAML"),
    ("", "must be a mapping"),
    ("[1, 2]", "must be a mapping"),
    ("{}", "field 'name' is required"),
    ("name: w\narrivals: [poisson]\ninputTokens: {distribution: fixed, value: 1}\n"
     "outputTokens: {distribution: fixed, value: 1}\n", "arrivals[0] must be a mapping"),
])
def test_bad_workload_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_simulation: list[object], text: str, message: str,
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    assert main(GOOD + ["--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--workload: workload {path}" in err and message in err and "Traceback" not in err
    assert no_simulation == []


def test_good_flags_reach_the_simulation(no_simulation: list[object]) -> None:
    assert main(GOOD) == 0 and len(no_simulation) == 1


def test_a_missing_workload_file_as_a_command_prints_no_traceback(tmp_path: Path) -> None:
    args = GOOD + ["--workload", str(tmp_path / "absent.yaml")]
    done = subprocess.run([sys.executable, "-m", "kvpilot.cli", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "absent.yaml: cannot read the file" in done.stderr
