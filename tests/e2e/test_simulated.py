"""The simulated backend for real: the local kubelet runs the build Job and the serving pods as processes
(kvsim behind the same trtllm-build / trtllm-serve command lines), so builds can fail and take time."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from tests.cases.engines import base, override
from tests.e2e.conftest import Operator, apply, condition, get, kubectl, wait_for


def sim_engine(ns: str, name: str = "sim", **spec: Any) -> dict[str, Any]:
    doc = override(base(name, backend="simulated"),
                   runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "speedupRatio": 10},
                   autotune={"mode": "Advisory", "intervalSeconds": 5, "warmupSeconds": 0})
    doc = override(doc, **spec)
    doc["metadata"]["namespace"] = ns
    return doc


def ie(ns: str, name: str = "sim") -> dict[str, Any]:
    return get("inferenceengine", name, ns) or {}


def jobs(ns: str) -> list[dict[str, Any]]:
    return json.loads(kubectl("get", "jobs", "-n", ns, "-o", "json"))["items"]  # type: ignore[no-any-return]


def ready_pod_ips(ns: str) -> list[str]:
    pods = json.loads(kubectl("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=server", "-o", "json"))
    return [p["status"]["podIP"] for p in pods["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]


def test_simulated_engine_builds_for_real_and_serves_openai(ns: str) -> None:
    apply(sim_engine(ns))
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    status = ie(ns)["status"]
    (job,) = jobs(ns)
    assert job["status"].get("succeeded") == 1
    # The engine the real trtllm-build command line produced (kvsim) is on the volume, with its manifest.
    assert condition(ie(ns), "EngineReady")["reason"] == "EngineBuilt"
    (ip,) = ready_pod_ips(ns)
    body = json.dumps({"model": "sim", "prompt": "Hello", "max_tokens": 8}).encode()
    req = urllib.request.Request(f"http://{ip}:8000/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.load(resp)
    assert out["usage"]["completion_tokens"] == 8
    # The operator scrapes the pod's KV-cache pool into status.
    kv = wait_for(lambda: ie(ns)["status"].get("kvCache"), 60, "status.kvCache")
    assert kv["maxBlocks"] > 0 and kv["tokensPerBlock"] == 32
    assert status["engine"]["maxBatchSize"] == 512


def test_failed_build_keeps_the_previous_engine_serving(ns: str) -> None:
    apply(sim_engine(ns))
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    good = ie(ns)["status"]["engine"]["fingerprint"]
    apply(sim_engine(ns, build__maxBatchSize=1024, runtime__env=[{"name": "KVSIM_FAIL_BUILD",
                                                                   "value": "CUDA error: out of memory"}]))
    def failed() -> dict[str, Any] | None:
        c = condition(ie(ns), "EngineReady")
        return c if c.get("reason") == "BuildFailed" else None
    cond = wait_for(failed, 180, "EngineReady=BuildFailed")
    assert "out of memory" in cond["message"]
    assert condition(ie(ns), "Degraded")["reason"] == "BuildFailed"
    assert condition(ie(ns), "Available")["status"] == "True"
    assert ie(ns)["status"]["engine"]["fingerprint"] == good
    assert ready_pod_ips(ns)
    # Bounded retries and no hot loop: the failed Job stays, nothing new is created.
    failed_jobs = [j for j in jobs(ns) if j["status"].get("failed")]
    assert len(failed_jobs) == 1 and failed_jobs[0]["spec"]["backoffLimit"] == 2
    time.sleep(10)
    assert len(jobs(ns)) == 2


def test_operator_restart_mid_build_creates_no_duplicate_job(ns: str, operator: Operator) -> None:
    apply(sim_engine(ns, runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "buildSeconds": 20}))
    wait_for(lambda: jobs(ns), 60, "the build Job")
    operator.kill()
    operator.start()
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    assert len(jobs(ns)) == 1
