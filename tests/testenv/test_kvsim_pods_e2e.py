"""End-to-end tests of kvsim's TensorRT-LLM stand-ins as the local kubelet runs them: `trtllm-build` as a simulated
Job writing an engine to a hostPath volume, and `trtllm-serve` as a simulated pod answering on its own IP. Split
from test_localcluster_e2e.py, whose helpers they share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hack.testenv import cluster
from tests.testenv.test_localcluster_e2e import SIM, apply, engine_volume, get, job, wait_until

pytestmark = pytest.mark.e2e


def _kvsim_has(subcommand: str) -> bool:
    """Whether this checkout's kvsim CLI provides `subcommand` (it is being built alongside)."""
    venv_kvsim = Path(sys.executable).parent / "kvsim"
    kvsim = os.fspath(venv_kvsim) if venv_kvsim.exists() else "kvsim"
    try:
        done = subprocess.run([kvsim, subcommand, "--help"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


KVSIM_BUILD = {
    "metadata": {"labels": dict(SIM)},
    "spec": {
        "restartPolicy": "Never",
        "initContainers": [
            {
                "name": "checkpoint",
                "image": "kvpilot/kvsim:dev",
                "command": ["kvsim", "checkpoint"],
                "args": ["--profile", "$(KVSIM_PROFILE)", "--output_dir", "/engines/ckpt"],
                "env": [{"name": "KVSIM_PROFILE", "value": "llama-3.1-8b-fp8-h100"}],
                "volumeMounts": [{"name": "engines", "mountPath": "/engines"}],
            }
        ],
        "containers": [
            {
                "name": "build",
                "image": "kvpilot/kvsim:dev",
                # an image path: the local kubelet maps it to its `kvsim trtllm-build` shim
                "command": ["/usr/local/bin/trtllm-build"],
                "args": ["--checkpoint_dir", "/engines/ckpt", "--output_dir", "/engines/fp", "--max_batch_size", "64"],
                "volumeMounts": [{"name": "engines", "mountPath": "/engines"}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": "engines"}}],
    },
}


def test_kvsim_trtllm_build_runs_as_a_simulated_job(ns: str, tmp_path: Path) -> None:
    if not _kvsim_has("trtllm-build"):
        pytest.skip("`kvsim trtllm-build` is not available yet in this checkout")
    try:
        apply(ns, [*engine_volume(ns, tmp_path / "engines"), job("build", KVSIM_BUILD)])
        wait_until("Job build Complete", lambda: get(ns, "job", "build")["status"].get("succeeded") == 1)
        engine = json.loads((tmp_path / "engines" / "fp" / "config.json").read_text())
        assert engine["build_config"]["max_batch_size"] == 64
        assert (tmp_path / "engines" / "fp" / "rank0.engine").exists()
    finally:
        cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)


def test_kvsim_trtllm_serve_runs_as_a_simulated_pod(ns: str, tmp_path: Path) -> None:
    if not (_kvsim_has("trtllm-build") and _kvsim_has("trtllm-serve")):
        pytest.skip("`kvsim trtllm-serve` is not available yet in this checkout")
    serve = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "serve", "labels": dict(SIM)},
        "spec": {
            "containers": [
                {
                    "name": "trtllm-serve",
                    "image": "kvpilot/kvsim:dev",
                    "command": ["trtllm-serve"],
                    "args": ["/engines/fp", "--backend", "tensorrt", "--host", "0.0.0.0", "--port", "8000",
                             "--max_batch_size", "32"],
                    "env": [{"name": "KVSIM_PROFILE", "value": "llama-3.1-8b-fp8-h100"}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "engines", "mountPath": "/engines"}],
                }
            ],
            "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": "engines"}}],
        },
    }
    try:
        apply(ns, [*engine_volume(ns, tmp_path / "engines"), job("build", KVSIM_BUILD)])
        wait_until("Job build Complete", lambda: get(ns, "job", "build")["status"].get("succeeded") == 1)
        apply(ns, serve)
        cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/serve", "--timeout=90s")
        ip = get(ns, "pod", "serve")["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8000/health", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as resp:
            assert resp.status == 200
    finally:
        cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)
