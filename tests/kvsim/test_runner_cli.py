"""Runs, sweeps, summaries and the kvsim command line."""

from __future__ import annotations

import json
import math

import pytest
from kvsim import EngineConfig, Request, RequestRecord
from kvsim.cli import main
from kvsim.runner import run_workload, sweep
from kvsim.summary import percentile, summarize
from kvsim.workload import load_workload


def record(rid, arrival, first, finish, out, error=None):
    return RequestRecord(rid, arrival, 10, out, out, output_tokens=out, start_s=arrival, first_token_s=first,
                         finish_s=finish, error=error)


def test_summary_goodput_counts_misses_and_unfinished():
    records = [record(0, 0.0, 0.1, 1.1, 11), record(1, 0.0, 3.0, 4.0, 11), record(2, 0.0, 0.1, 5.1, 11),
               RequestRecord(3, 0.0, 10, 5, 5), RequestRecord(4, 0.0, 10, 5, 5, error="too long")]
    s = summarize(records, slo_ttft_ms=2000, slo_tpot_ms=200, duration_s=10)
    assert s["finished"] == 3 and s["unfinished"] == 1 and s["rejected"] == 1
    assert s["goodputRequestsPerSecond"] == pytest.approx(0.1)  # only request 0 meets both SLOs
    assert s["sloAttainment"] == pytest.approx(0.2)
    assert s["tpotMs"]["max"] == pytest.approx(500)
    assert s["outputTokensPerSecond"] == pytest.approx(3.3)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5 and math.isnan(percentile([], 50))


def test_run_records_rejections_and_timeline():
    reqs = [Request(100, 10, arrival_s=0.0), Request(9000, 10, arrival_s=0.1)]
    result = run_workload(EngineConfig(max_seq_len=8192), reqs, timeline_interval_s=0.01)
    assert [r.error is None for r in result.records] == [True, False]
    assert result.timeline and result.summary()["rejected"] == 1


def test_horizon_leaves_unfinished_requests():
    reqs = load_workload("chat").requests(duration_s=60, rate_scale=20)
    result = run_workload(EngineConfig(max_batch_size=8), reqs, horizon_s=30)
    assert result.horizon_reached and result.summary()["unfinished"] > 0


def test_sweep_raises_the_build_ceiling_for_larger_runtime_values():
    reqs = load_workload("chat").requests(duration_s=30)
    rows = sweep(EngineConfig(build_max_batch_size=64), reqs, {"max_batch_size": [4, 128]})
    assert [r["params"]["max_batch_size"] for r in rows] == [4, 128]
    assert rows[0]["summary"]["ttftMs"]["p99"] > rows[1]["summary"]["ttftMs"]["p99"]


def test_cli_run_json_and_svg(tmp_path, capsys):
    assert main(["run", "--workload", "chat", "--duration", "60", "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["finished"] > 200
    assert (tmp_path / "timeline.svg").read_text().startswith("<?xml")
    assert "timeline" in json.loads((tmp_path / "run.json").read_text())


def test_cli_bench_throughput_json(capsys):
    assert main(["bench-throughput", "--isl", "128", "--osl", "128", "--num-requests", "2000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outputTokensPerSecond"] > 1000 and doc["maxBatchSize"] == 4096


def test_cli_sweep_rejects_unknown_fields_and_non_numbers(capsys):
    assert main(["sweep", "--workload", "chat", "--duration", "10", "--param", "nonsense=1,2"]) == 2
    assert "kvsim sweep: --param must be FIELD=V1,V2 with FIELD an EngineConfig field" in capsys.readouterr().err
    assert main(["sweep", "--workload", "chat", "--duration", "10", "--param", "max_batch_size=a,8"]) == 2
    err = capsys.readouterr().err
    assert "kvsim sweep: --param max_batch_size takes numbers" in err and "'a'" in err and "Traceback" not in err


def test_cli_reports_bad_values_without_traceback(capsys):
    assert main(["run", "--workload", "chat", "--duration", "10", "--max-batch-size", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [("a: [", "is not YAML"), ("[1]", "must be a mapping"),
                                           ("{}", "field 'name' is required")])
def test_cli_bad_workload_file_is_one_line_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    assert main(["run", "--workload", str(path), "--duration", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvsim run: workload {path}") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_missing_workload_file_and_bad_profile_are_named(tmp_path, capsys):
    assert main(["run", "--workload", str(tmp_path / "absent.yaml"), "--duration", "5"]) == 2
    assert "absent.yaml: cannot read the file" in capsys.readouterr().err
    assert main(["bench-throughput", "--profile", "nonsense", "--isl", "8", "--osl", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim bench-throughput: profile name 'nonsense'")  # the message, not a quoted repr


def test_cli_help_exits_0(capsys):
    for args in (["--help"], ["run", "--help"], ["sweep", "--help"], ["checkpoint", "--help"],
                 ["trtllm-build", "--help"]):
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 0, args
        assert "usage:" in capsys.readouterr().out, args


def test_cli_an_out_folder_that_cannot_be_made_is_named(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["run", "--workload", "chat", "--duration", "5", "--out", str(blocker / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvsim run: {blocker / 'x'}") and "Not a directory" in err and "Traceback" not in err
