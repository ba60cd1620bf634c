"""The simulated backend under TensorRT-LLM release surfaces (kvsim plays KVSIM_TRTLLM_RELEASE): the operator
renders what that release accepts, the pods expose what it exposes, and the tuner gets its signals either way; and
on 1.4, where PyTorch is the only backend, a simulated PyTorch engine goes through the prepare Job once."""

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


# The release kvsim plays for the PyTorch path: 1.4, where PyTorch is TensorRT-LLM's only backend.
PYTORCH_RELEASE = "1.4"


def _kvsim_plays(release: str) -> bool:
    from kvsim.trtllm.releases import RELEASES

    return release in RELEASES


def _ready_seconds(pod: dict) -> float | None:
    """A pod's start to Ready, from its own status (what a restart costs it)."""
    from datetime import datetime

    ready = next((c for c in pod["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"),
                 None)
    started = pod["status"].get("startTime")
    if ready is None or not started:
        return None
    parse = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    return (parse(ready["lastTransitionTime"]) - parse(started)).total_seconds()


def _raised(ns: str, name: str, start: int) -> dict | None:
    """The first applied Raise in status.autotune.history, once the value in force is above ``start``."""
    status = ie(ns, name).get("status") or {}
    if (status.get("batching") or {}).get("maxBatchSize", 0) <= start:
        return None
    return next((h for h in reversed((status.get("autotune") or {}).get("history") or [])
                 if h.get("applied") and h.get("action") == "Raise"), None)


@pytest.mark.xfail(not _kvsim_plays(PYTORCH_RELEASE), run=False, reason="kvsim does not play 1.4 yet (kvsim branch)")
def test_a_simulated_pytorch_engine_prepares_once_serves_read_only_and_retunes(ns: str) -> None:
    """kvsim playing 1.4's PyTorch backend: the prepare Job (kvsim prepare, then a real warm-up of kvsim's
    trtllm-serve on the staged checkpoint, which fills the autotuner cache) publishes once; the pods serve it from
    a read-only mount with the warm-up cache copied beside them; under load the tuner (mode Auto, no latency
    objective) raises on PyTorch's own signals -- numActiveRequests at the limit, numQueuedRequests waiting, the
    maxBatchSize* fields 0 -- and the pods roll without a second prepare; re-applying, or a second engine with the
    same inputs, prepares nothing."""
    import asyncio
    import time

    from hack import closedloop
    from hack.testenv import cluster
    from tests.e2e.test_simulated import jobs

    started = time.monotonic()
    start = 4
    # Real time (speedup 1): the load below overloads 4 slots ~2x with few requests a second (a light client).
    simulation = {"profile": "llama-3.1-8b-fp8-h100", "speedupRatio": 1, "backend": "pytorch"}
    env = [{"name": "KVSIM_TRTLLM_RELEASE", "value": PYTORCH_RELEASE}]
    tuning = {"mode": "Auto", "minBatchSize": start, "maxBatchSize": 64, "intervalSeconds": 5, "cooldownSeconds": 15,
              "warmupSeconds": 0}
    doc = sim_engine(ns, "pt", runtime__simulation=simulation, runtime__env=env, batching={"maxBatchSize": start},
                     autotune=tuning)
    apply(doc)
    kubectl("wait", "--for=condition=Available", "ie/pt", "-n", ns, "--timeout=180s")
    engine = ie(ns, "pt")["status"]
    fp = engine["engine"]["fingerprint"]
    assert engine["build"]["state"] == "Succeeded"
    contract = condition(ie(ns, "pt"), "ReleaseContract")
    assert contract["status"] == "True" and f"release {PYTORCH_RELEASE}" in contract["message"]

    (job,) = jobs(ns)
    assert job["spec"]["template"]["spec"]["containers"][0]["name"] == "prepare"
    (log_file,) = (cluster.testenv_dir() / "logs" / "pods" / ns).glob(f"{job['metadata']['name']}-*/prepare.log")
    log = log_file.read_text()  # what the local kubelet's container printed (no kubelet API for kubectl logs)
    assert "kvsim prepare: wrote" in log and "warm-up served /health after" in log, log[-2000:]
    published = cluster.testenv_dir() / "volumes" / ns / "engines" / fp
    assert json.loads((published / "kvpilot-engine.json").read_text())["kind"] == "prepared"
    tuned = json.loads((published / "warmup" / "autotuner.json").read_text())["rank_0"]  # filled by the warm-up
    assert tuned and all("kvsim::warmup" in key for key in tuned)
    assert not list((published.parent / ".staging").iterdir())

    options = yaml.safe_load((get("configmap", "pt-llm-api", ns) or {})["data"]["llm-api.yaml"])
    assert "dynamic_batch_config" not in options["scheduler_config"]
    assert options["cuda_graph_config"] == {"max_batch_size": start, "enable_padding": True}
    pods = json.loads(kubectl("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=server", "-o", "json"))
    (pod,) = pods["items"]
    server = pod["spec"]["containers"][0]
    assert server["args"][0] == f"/engines/{fp}/checkpoint" and server["args"][server["args"].index("--backend") + 1] \
        == "pytorch"
    assert all(m["readOnly"] for m in server["volumeMounts"] if m["name"] == "engines")
    assert pod["spec"]["initContainers"][0]["name"] == "warm-cache"
    (ip,) = ready_pod_ips(ns)
    status, body = http(f"http://{ip}:8000/v1/completions", {"model": "pt", "prompt": "Hello", "max_tokens": 8})
    assert status == 200, body
    status, body = http(f"http://{ip}:8000/metrics")  # PyTorch's shape: the cap, no batch size (drains a sample)
    assert status == 200 and all(s["maxBatchSizeRuntime"] == 0 and s["maxNumActiveRequests"] == start
                                 for s in json.loads(body))
    served_log = cluster.testenv_dir() / "logs" / "pods" / ns / pod["metadata"]["name"] / f"{server['name']}.log"
    assert "0 token buckets tuned" in served_log.read_text()  # the pod loaded the prepared cache: nothing to tune
    print(f"pytorch e2e: prepare Job + first pod Ready after {time.monotonic() - started:.1f} s; pod start to "
          f"Ready {_ready_seconds(pod)} s")

    # Retune: more requests than 4 slots hold. No objective is set, so the evidence is the queue beside a full
    # batch, read from numActiveRequests / numQueuedRequests (maxBatchSizeRuntime reads 0 on PyTorch).
    loaded = time.monotonic()
    stats = closedloop.LoadStats()

    async def drive() -> None:
        with closedloop.service_gateway(ns, "pt") as gateway:
            # Up to 240 s: on a loaded machine the load generator offers less than its rate, and the queue that is
            # the evidence builds later (a CI run on the shared machine saw no Raise within 120 s + 30 s).
            await closedloop.generate_load(gateway.endpoints, rate=12, seconds=240, prompt_words=100,
                                           max_tokens=100, stats=stats,
                                           stop=lambda: _raised(ns, "pt", start) is not None)

    asyncio.run(drive())
    raise_ = wait_for(lambda: _raised(ns, "pt", start), 30, "an applied Raise")
    assert raise_["reason"] == "QueueWithHeadroom" and raise_["fromBatchSize"] == start, raise_
    assert f"the batch is full ({start}/{start})" in raise_["message"] and "requests wait on average" in raise_["message"]
    if "a restart cannot make it worse" not in raise_["message"]:  # severe misses skip the pricing (load-bound)
        assert "CUDA graphs +" in raise_["message"]  # the change's cost counts the graphs the raise captures
    kubectl("wait", "--for=condition=Progressing=False", "ie/pt", "-n", ns, "--timeout=120s")
    target = ie(ns, "pt")["status"]["batching"]["maxBatchSize"]
    options = yaml.safe_load((get("configmap", "pt-llm-api", ns) or {})["data"]["llm-api.yaml"])
    assert options["max_batch_size"] == target and options["cuda_graph_config"]["max_batch_size"] == target
    assert [j["metadata"]["name"] for j in jobs(ns)] == [job["metadata"]["name"]]  # a retune prepares nothing
    print(f"pytorch e2e: raised {start} -> {target} and rolled out {time.monotonic() - loaded:.1f} s after the load "
          f"began ({stats.sent} requests sent, {stats.errors} failed): {raise_['message']}")

    apply(doc)  # the same manifest again: nothing prepares again
    second = sim_engine(ns, "pt2", runtime__simulation=simulation, runtime__env=env)
    apply(second)
    kubectl("wait", "--for=condition=Available", "ie/pt2", "-n", ns, "--timeout=120s")
    ready = condition(ie(ns, "pt2"), "EngineReady")
    assert (ready["status"], ready["reason"]) == ("True", "CacheHit") and ie(ns, "pt2")["status"]["engine"][
        "fingerprint"] == fp
    assert [j["metadata"]["name"] for j in jobs(ns)] == [job["metadata"]["name"]]  # one prepare, ever
    assert ie(ns, "pt")["status"]["build"] == engine["build"]
    print(f"pytorch e2e: {time.monotonic() - started:.1f} s in all")
