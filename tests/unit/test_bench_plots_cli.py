"""``python -m kvpilot.bench.plots``: --help, and a bad suite file gets one line naming the file and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpilot.bench.plots import main


def suite_row(case: str = "light-chat") -> dict[str, Any]:
    point = {"t": 60, "offered": 2.0, "limit": 64, "kv": 0.5, "ttftP95": 120.0, "tpotP95": 20.0,
             "attainment": 0.99, "inForce": [64, 64], "active": 12.0}
    return {"case": case, "profile": "llama-3.1-8b-fp8-h100", "ratios": {"overOracle": 1.01},
            "autotuned": {"goodput": 1.9, "changes": 1, "history": [{"atSeconds": 60, "to": 96}],
                          "series": [point, {**point, "t": 120, "kv": None, "inForce": None}]}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(text)
    return path


def test_help_says_what_it_does_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "SUITE.json" in out and "OUTPUT_DIR" in out and "SVG" in out


def test_help_as_a_module_exits_0() -> None:
    done = subprocess.run([sys.executable, "-m", "kvpilot.bench.plots", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m kvpilot.bench.plots" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("{not json", "not JSON"),
    ("", "the file is empty"),
    ("   \n", "the file is empty"),
    ("[1, 2]", "must be a JSON object with a 'cases' list, got a list"),
    ('"cases"', "must be a JSON object with a 'cases' list, got a string"),
    ("{}", "'cases' must be a list of case results, got nothing"),
    ('{"cases": 3}', "'cases' must be a list of case results, got a number"),
    ('{"cases": [7]}', "cases[0] must be a JSON object, got a number"),
    ('{"cases": [{"case": "x"}]}', "cases[0].profile must be a string"),
])
def test_malformed_or_wrongly_shaped_json_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str,
) -> None:
    path = write(tmp_path, text)
    assert main([str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(path) in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing drawn, nothing created


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda r: r.pop("autotuned"), "cases[0].autotuned must be a JSON object"),
    (lambda r: r["autotuned"].pop("history"), "cases[0].autotuned.history must be a list"),
    (lambda r: r["autotuned"]["history"].append({"to": 8}), "cases[0].autotuned.history[1].atSeconds must be a number"),
    (lambda r: r["autotuned"].update(series={"t": 1}), "cases[0].autotuned.series must be a list"),
    (lambda r: r["autotuned"]["series"][1].update(t="soon"), "cases[0].autotuned.series[1].t must be a number"),
    (lambda r: r["autotuned"]["series"][0].update(kv=True), "series[0].kv must be a number or null"),
    (lambda r: r["autotuned"]["series"][0].update(inForce=[1, "x"]), "series[0].inForce must be a list of numbers"),
    (lambda r: r["ratios"].pop("overOracle"), "cases[0].ratios.overOracle must be a number, got nothing"),
    (lambda r: r.update(case="../../escape"), "cases[0].case must be a name"),
    (lambda r: r.update(case=".hidden"), "cases[0].case must be a name"),
    (lambda r: r["autotuned"]["history"][0].update(rollback="yes"), "history[0].rollback must be true or false"),
    (lambda r: r["autotuned"].update(verifications={}), "cases[0].autotuned.verifications must be a list"),
    (lambda r: r["autotuned"].update(verifications=[{"outcome": "Keep"}]), "verifications[0].atSeconds must be a"),
    (lambda r: r["autotuned"].update(canaries=[{"startSeconds": 1, "endSeconds": "x"}]),
     "canaries[0].endSeconds must be a number or null"),
    (lambda r: r.update(autotunedFrom2048={"goodput": 1}), "cases[0].autotunedFrom2048.changes must be a number"),
])
def test_missing_or_mistyped_fields_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any, field: str,
) -> None:
    row = suite_row()
    mutate(row)
    path = write(tmp_path, json.dumps({"cases": [row]}))
    assert main([str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and err.count("\n") == 1


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.json"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "absent.json: cannot read the suite file" in err and "Traceback" not in err


def test_wrong_arguments_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["only-one.json"])
    assert exited.value.code == 2
    assert "OUTPUT_DIR" in capsys.readouterr().err


def test_bad_file_as_a_module_prints_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "[")
    done = subprocess.run([sys.executable, "-m", "kvpilot.bench.plots", str(path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "not JSON" in done.stderr


def test_a_well_formed_suite_is_drawn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = write(tmp_path, json.dumps({"cases": [suite_row("light-chat"), suite_row("burst-a100")]}))
    assert main([str(path), str(tmp_path / "out")]) == 0
    drawn = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert drawn == ["burst-a100.svg", "light-chat.svg"]
    assert (tmp_path / "out" / "light-chat.svg").read_text().lstrip().startswith("<?xml")
    assert capsys.readouterr().out.count(".svg") == 2


def test_verifications_rollbacks_and_canaries_are_drawn(tmp_path: Path) -> None:
    """The marks issue 18 asks for: a rollback (red), each verification's verdict, each canary's span; and the
    run started from 2048 on request, only for the rows asked for."""
    pytest.importorskip("matplotlib")
    row = suite_row("long-output-a100.decode0.8-perseq1.5")
    row["autotuned"]["history"].append({"atSeconds": 90, "to": 64, "rollback": True})
    row["autotuned"]["verifications"] = [{"atSeconds": 90, "outcome": "RollBack"}]
    row["autotuned"]["canaries"] = [{"startSeconds": 60, "endSeconds": 90, "outcome": "RollBack"}]
    row["autotunedFrom2048"] = {**row["autotuned"], "verifications": [{"atSeconds": 75, "outcome": "Keep"}]}
    row["ratios"]["from2048OverOracle"] = 0.99
    path = write(tmp_path, json.dumps({"cases": [row, suite_row("light-chat")]}))
    assert main([str(path), str(tmp_path / "out"), "--from-2048", "--case", row["case"]]) == 0
    drawn = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert drawn == [f"{row['case']}.from2048.svg", f"{row['case']}.svg"]
    svg = (tmp_path / "out" / f"{row['case']}.svg").read_text()
    assert "rollback -&gt;64" in svg and "#d62728" in svg  # the rollback's label and tab:red
