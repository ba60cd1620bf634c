"""The simulated backend under two TensorRT-LLM release surfaces (kvsim plays KVSIM_TRTLLM_RELEASE): the operator
renders what that release accepts, the pods expose what it exposes, and the tuner gets its signals either way."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from tests.e2e.conftest import apply, condition, get, kubectl, wait_for
from tests.e2e.test_simulated import ie, ready_pod_ips, sim_engine


def http(url: str, body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


@pytest.mark.parametrize("release", ["1.2.0", "1.3"])
def test_the_operator_renders_and_reads_each_release_surface(ns: str, release: str) -> None:
    name = "rel-" + release.replace(".", "-")
    apply(sim_engine(ns, name, runtime__env=[{"name": "KVSIM_TRTLLM_RELEASE", "value": release}]))
    kubectl("wait", "--for=condition=Available", f"ie/{name}", "-n", ns, "--timeout=180s")
    contract = condition(ie(ns, name), "ReleaseContract")
    assert contract["status"] == "True" and f"release {release}" in contract["message"]

    cm = get("configmap", f"{name}-llm-api", ns) or {}
    options = yaml.safe_load(cm["data"]["llm-api.yaml"])
    # 1.2's TrtLlmArgs lacks perf_metrics_max_requests: return_perf_metrics would crash-loop the pods (#9678).
    assert ("return_perf_metrics" in options) is (release == "1.3")

    (ip,) = ready_pod_ips(ns)
    for _ in range(4):
        status, _ = http(f"http://{ip}:8000/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 8})
        assert status == 200
    status, text = http(f"http://{ip}:8000/prometheus/metrics")
    if release == "1.3":
        assert status == 200 and "trtllm_time_to_first_token_seconds" in text
    else:
        assert status == 404  # 1.2 mounts the page only with return_perf_metrics

    # The tuner's signals: the KV pool from /metrics on every release, and no sample rejected.
    kv = wait_for(lambda: ie(ns, name)["status"].get("kvCache"), 60, "status.kvCache")
    assert kv["maxBlocks"] > 0 and kv["tokensPerBlock"] == 32
    valid = wait_for(lambda: condition(ie(ns, name), "MetricsValid") or None, 60, "MetricsValid")
    assert valid["status"] == "True", valid
