"""kvsim's ``/prometheus/metrics`` passes ``promtool check metrics`` (Prometheus' own linter: counter suffixes,
base units, HELP text) once every labelled family has samples. The e2e checks the same on the operator's
``/metrics`` and on kvsim inside the cluster (tests/e2e/test_prometheus.py)."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
from kvsim.trtllm.build import main as build_main
from kvsim.trtllm.checkpoint import main as checkpoint_main

from .serve_process import serve


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(root / "ckpt")])
    assert build_main(["--checkpoint_dir", str(root / "ckpt"), "--output_dir", str(root / "engine"),
                       "--max_batch_size", "8", "--max_input_len", "1024", "--max_seq_len", "2048"]) == 0
    (root / "extra.yaml").write_text("return_perf_metrics: true\n")
    args = [str(root / "engine"), "--backend", "tensorrt", "--max_batch_size", "8", "--extra_llm_api_options", str(root / "extra.yaml")]
    # return_perf_metrics (and with it /prometheus/metrics) works on the TensorRT backend from 1.3 (PR #10662)
    with serve(args, env={"KVSIM_SPEEDUP": "5", "KVSIM_TRTLLM_RELEASE": "1.3"}) as (base, _process):
        yield base


def test_promtool_finds_nothing_to_fix_in_kvsims_exposition(server):
    body = json.dumps({"model": "engine", "prompt": "hello " * 20, "max_tokens": 8}).encode()
    for _ in range(2):
        req = urllib.request.Request(server + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    with urllib.request.urlopen(server + "/prometheus/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "trtllm_time_to_first_token_seconds_bucket" in text  # the labelled histograms have samples
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
