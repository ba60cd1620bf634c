"""Scale benchmark: N InferenceEngines on one operator, on a local control plane of its own.

    make bench-scale ENGINES=1000          # or: .venv/bin/python -m hack.bench_scale --engines 1000

It starts its own cluster (state in .testenv-bench, so an e2e cluster of the same worktree is untouched)
with enough kwok fake GPU nodes, installs the chart, runs the operator as a local process under the chart's
ServiceAccount, applies N engines (TensorRT backend, served on the fake nodes; 100 distinct build
fingerprints over 10 namespaces, so 100 shared build Jobs) and measures:

* time from the first apply until every engine is Available;
* the operator's peak RSS (VmHWM) and CPU seconds, per phase;
* API requests per minute during the rollout and while idle, by verb and resource, from the API server's
  own ``apiserver_request_total``. The API server does not say who asked, so the operator's idle share is
  the idle rate with the operator running minus the idle rate with it stopped (the controllers' and kwok's
  own traffic); the operator's own counter (``kvpilot_api_requests_total``) is reported next to it;
* restart settle: a new operator process lists everything and reconciles every engine once; the time until
  it has, and how many writes it made meanwhile (none are needed: nothing changed).

It writes ``bench-scale-N.json`` in the repository root and prints a table. It measures; it asserts nothing.
The figures depend on the machine and on what else runs on it: say so when you quote them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
os.environ.setdefault("KVPILOT_TESTENV_DIR", str(ROOT / ".testenv-bench"))
os.environ.setdefault("TESTENV_KCM_QPS", "200")
# kwok's pod IPs are loopback addresses, which the endpoint controllers refuse and retry forever (thousands of
# Endpoints PUTs and Event PATCHes a minute at 1,000 Services): noise that is not the operator's. The benchmark
# does not need endpoints (nothing routes to the fake pods), so it turns those controllers off.
os.environ.setdefault("TESTENV_KCM_CONTROLLERS",
                      "*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller")
from hack import closedloop  # noqa: E402 — after the environment above, which the testenv reads
from hack.testenv import cluster  # noqa: E402
from hack.bench_operator import Operator  # noqa: E402

GPUS_PER_NODE = 64
PODS_PER_NODE = 250
REQUEST_RE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def log(msg: str) -> None:
    print(f"[bench-scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def nodes(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        name = f"bench-gpu-{i}"
        res = {"cpu": "512", "memory": "4Ti", "ephemeral-storage": "10Ti", "pods": str(PODS_PER_NODE),
               "nvidia.com/gpu": str(GPUS_PER_NODE)}
        out.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok", "nvidia.com/gpu.present": "true",
                                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                    "nvidia.com/gpu.count": str(GPUS_PER_NODE)}},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "allocatable": res, "capacity": res},
        })
    return out


def engine(i: int, namespaces: int, fingerprints: int) -> dict[str, Any]:
    fp = i % fingerprints  # engine i shares its build with every engine j = i (mod fingerprints)
    return {
        "apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine",
        "metadata": {"name": f"engine-{i:05d}", "namespace": f"bench-{fp % namespaces}"},
        "spec": {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                      "revision": "0e9e39f249a16976918f6564b8830bc894c89659", "architecture": "llama"},
            "runtime": {"backend": "tensorrt"},
            "build": {"maxBatchSize": 128 + fp},  # distinct build inputs: one fingerprint per value
            "engineCache": {"claimName": "engines"},
            "serving": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "replicas": 1},
        },
    }


def request_counts() -> dict[tuple[str, str], float]:
    """The API server's request counters, summed by (verb, resource[/subresource])."""
    text = cluster.kubectl("get", "--raw", "/metrics", timeout_s=60)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in text.splitlines():
        m = REQUEST_RE.match(line)
        if not m:
            continue
        labels = dict(LABEL_RE.findall(m["labels"]))
        res = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        out[(labels.get("verb", ""), res)] += float(m["value"])
    return out


def per_minute(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], seconds: float
               ) -> dict[str, float]:
    keys = set(before) | set(after)
    rates = {f"{v} {r}": (after.get((v, r), 0) - before.get((v, r), 0)) * 60 / seconds for v, r in keys}
    return {k: round(v, 1) for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05}


def engines_available() -> tuple[int, int]:
    """(Available, total) from the server-side table (its Ready column is the Available condition): a few
    bytes per engine, where ``-o json`` moved megabytes every poll and took CPU from what is measured."""
    rows = [line.split() for line in cluster.kubectl("get", "inferenceengines", "-A", "--no-headers",
                                                     timeout_s=120).splitlines() if line.strip()]
    return sum(1 for r in rows if len(r) > 2 and r[2] == "True"), len(rows)


def apply_pool(docs: list[dict[str, Any]], workers: int) -> tuple[float, float]:
    """Server-side apply of every engine from a bounded pool of threads, as a GitOps controller or a script
    applying a fleet does (kubectl applies one object after another). Returns (seconds until the first
    apply was accepted, seconds until the last was)."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.dynamic import DynamicClient

    conf = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig_path()), client_configuration=conf)
    conf.connection_pool_maxsize = workers
    dyn = DynamicClient(k8s_client.ApiClient(conf))
    res = dyn.resources.get(api_version="serving.kvpilot.io/v1alpha1", kind="InferenceEngine")
    t0 = time.monotonic()
    accepted: list[float] = []

    def one(doc: dict[str, Any]) -> None:
        for attempt in range(5):
            try:
                dyn.server_side_apply(res, body=doc, namespace=doc["metadata"]["namespace"],
                                      field_manager="bench-scale", force_conflicts=True)
                accepted.append(time.monotonic() - t0)
                return
            except Exception as exc:  # noqa: BLE001 — retried, then reported with the engine's name
                if attempt == 4:
                    raise RuntimeError(f"apply of {doc['metadata']['name']} failed: {exc}") from exc
                time.sleep(1 + attempt)

    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(one, docs):
            done += 1
            if done % 250 == 0 or done == len(docs):
                log(f"  {done}/{len(docs)} applied")
    return min(accepted), max(accepted)


def apply_kubectl(docs: list[dict[str, Any]]) -> tuple[float, float]:
    """One ``kubectl apply --server-side`` of a multi-document file (kubectl applies the objects in turn)."""
    t0 = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs), timeout_s=1800)
    return 0.0, time.monotonic() - t0


def diff_calls(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    keys = set(before) | set(after)
    rates = {k: round((after.get(k, 0) - before.get(k, 0)) * 60 / seconds, 1) for k in keys}
    return {k: v for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=1000, help="InferenceEngines to apply (default 1000).")
    ap.add_argument("--fingerprints", type=int, default=100, help="Distinct build fingerprints (default 100).")
    ap.add_argument("--namespaces", type=int, default=10, help="Namespaces the engines spread over (default 10).")
    ap.add_argument("--resync-seconds", type=float, default=30.0, help="The operator's resync period (default 30).")
    ap.add_argument("--idle-seconds", type=float, default=120.0, help="Length of each idle window (default 120).")
    ap.add_argument("--timeout-seconds", type=float, default=1200.0, help="Give up waiting for Available after this.")
    ap.add_argument("--apply", choices=("pool", "kubectl"), default="pool",
                    help="How the engines are applied: server-side apply from a pool of threads (default), or one "
                         "kubectl apply --server-side of a multi-document file.")
    ap.add_argument("--apply-workers", type=int, default=16, help="Threads of the apply pool (default 16).")
    ap.add_argument("--profile-restart", metavar="FILE",
                    help="Sample the restarted operator with py-spy until it settles (collapsed stacks to FILE; "
                         "needs py-spy: pip install py-spy).")
    ap.add_argument("--keep", action="store_true", help="Leave the benchmark cluster running afterwards.")
    args = ap.parse_args(argv)
    n = args.engines
    if n < 1 or args.fingerprints < 1 or args.namespaces < 1:
        ap.error("--engines, --fingerprints and --namespaces must be at least 1")

    # Stopped by a signal (Ctrl-C, a CI timeout, or a background run whose SIGINT the shell ignores), it still
    # stops the operator and tears its cluster down.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {"engines": n, "fingerprints": min(args.fingerprints, n), "namespaces": args.namespaces,
                              "resyncSeconds": args.resync_seconds, "cpus": os.cpu_count(),
                              "loadAverageAtStart": round(os.getloadavg()[0], 2)}
    logdir = ROOT / ".testenv-bench" / "bench"
    if (cluster.testenv_dir() / "pids").is_dir():  # a leftover of an earlier run, whole or not: start from an empty etcd
        cluster.cluster_down()
    log(f"starting a control plane in {cluster.testenv_dir()}")
    cluster.ensure_cluster_up()
    logdir.mkdir(parents=True, exist_ok=True)
    op: Operator | None = None
    try:
        gpus = n + min(args.fingerprints, n)
        count = max(gpus // GPUS_PER_NODE + 1, n // PODS_PER_NODE + 1) + 1
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(nodes(count)), timeout_s=300)
        cluster.wait_condition("node", "Ready", selector="type=kwok", timeout_s=180)
        log(f"{count} fake GPU nodes ({GPUS_PER_NODE} GPUs each) are Ready; installing the chart")
        closedloop.install_chart()
        for i in range(args.namespaces):
            closedloop.create_namespace(f"bench-{i}")
        op = Operator(logdir, args.resync_seconds)
        op.start()
        time.sleep(5)

        log(f"applying {n} InferenceEngines")
        docs = [engine(i, args.namespaces, args.fingerprints) for i in range(n)]
        t0 = time.monotonic()
        api0 = request_counts()
        if args.apply == "pool":
            _first, last = apply_pool(docs, max(1, args.apply_workers))
        else:
            _first, last = apply_kubectl(docs)
        result["applyMode"] = args.apply if args.apply == "kubectl" else f"pool of {args.apply_workers}"
        result["applySeconds"] = round(last, 1)  # from the first apply until the API server accepted the last
        applied = t0 + last
        log(f"{n} engines applied in {last:.1f}s ({result['applyMode']}); waiting for Available")
        ok = 0
        while time.monotonic() - t0 < args.timeout_seconds:
            ok, total = engines_available()
            log(f"  {ok}/{total} Available at {time.monotonic() - t0:.0f}s")
            if ok >= n:
                break
            time.sleep(5)
        rollout_s = time.monotonic() - t0
        api1 = request_counts()
        result["allAvailableSeconds"] = round(rollout_s, 1) if ok >= n else None
        result["allAvailableAfterLastApplySeconds"] = round(time.monotonic() - applied, 1) if ok >= n else None
        result["availableAtEnd"] = ok
        result["loadAverageAfterRollout"] = round(os.getloadavg()[0], 2)
        rss, cpu = op.proc_stats()
        result["rolloutOperatorCpuSeconds"] = cpu
        result["rolloutApiRequestsPerMinute"] = per_minute(api0, api1, rollout_s)
        log(f"{ok}/{n} Available after {rollout_s:.0f}s; operator RSS peak {rss} MB, CPU {cpu} s")
        result["buildJobs"] = len(json.loads(cluster.kubectl(
            "get", "jobs", "-A", "-l", "app.kubernetes.io/managed-by=kvpilot", "-o", "json", timeout_s=120))["items"])

        log(f"idle with the operator running ({args.idle_seconds:.0f}s)")
        time.sleep(min(30.0, args.resync_seconds))
        _rss, cpu_a = op.proc_stats()
        ops_a, idle_a, ti = op.api_calls(), request_counts(), time.monotonic()
        time.sleep(args.idle_seconds)
        ops_b, idle_b, idle_s = op.api_calls(), request_counts(), time.monotonic() - ti
        _rss, cpu_b = op.proc_stats()
        with_op = per_minute(idle_a, idle_b, idle_s)
        result["idleOperatorCpuSecondsPerMinute"] = round((cpu_b - cpu_a) * 60 / idle_s, 2)
        result["loadAverageWhileIdle"] = round(os.getloadavg()[0], 2)
        result["idleOperatorOwnRequestsPerMinute"] = diff_calls(ops_a, ops_b, idle_s)

        log("restarting the operator")
        op.stop()
        op.start()
        spy = None
        if args.profile_restart:
            assert op.proc is not None
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(op.proc.pid),
                                    "-r", "50", "-f", "raw", "-o", args.profile_restart, "-d", "600"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        settle = None
        while time.monotonic() - op.started < 600:
            if op.reconciles() >= n:
                settle = time.monotonic() - op.started
                break
            time.sleep(1)
        result["restartSettleSeconds"] = round(settle, 1) if settle is not None else None
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled on SIGINT
            spy.wait(60)
        result["loadAverageAtRestart"] = round(os.getloadavg()[0], 2)
        log(f"restart settled in {result['restartSettleSeconds']}s")
        calls = op.api_calls()
        result["restartWrites"] = {k: v for k, v in calls.items() if not k.startswith(("get ", "list "))}
        result["restartWritesTotal"] = sum(v for k, v in result["restartWrites"].items()
                                           if not k.endswith("InferenceEngine/status"))
        result["cachedObjects"] = {k.split('"')[1]: v for k, v in op.metric_values().items()
                                   if k.startswith("kvpilot_cached_objects{")}
        rss2, _cpu = op.proc_stats()
        result["operatorPeakRssMB"] = max(rss, rss2)

        log(f"idle baseline with the operator stopped ({args.idle_seconds / 2:.0f}s)")
        op.stop()
        time.sleep(10)
        base_a, tb = request_counts(), time.monotonic()
        time.sleep(args.idle_seconds / 2)
        base_b, base_s = request_counts(), time.monotonic() - tb
        without = per_minute(base_a, base_b, base_s)
        operator_share = {k: round(with_op.get(k, 0) - without.get(k, 0), 1) for k in set(with_op) | set(without)}
        operator_share = {k: v for k, v in sorted(operator_share.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.5}
        status_patches = sum(v for k, v in operator_share.items() if k.endswith("inferenceengines/status"))
        result["idleApiRequestsPerMinuteWithOperator"] = with_op
        result["idleApiRequestsPerMinuteBaseline"] = without
        result["idleApiRequestsByVerbResource"] = operator_share
        result["idleStatusPatchesPerMinute"] = round(status_patches, 1)
        # An upper bound on the operator's share: per verb and resource, the rate with it minus without, a
        # negative difference (another client's noise, e.g. lease renewals) counted as 0, not subtracted.
        result["idleApiRequestsPerMinute"] = round(sum(max(0.0, v) for v in operator_share.values())
                                                   - max(0.0, status_patches), 1)
        result["metricScrapes"] = "not API requests: the pods' /metrics are read over HTTP (kwok pods refuse them)"
    finally:
        if op is not None:
            op.stop()
        if not args.keep:
            cluster.cluster_down()

    out = ROOT / f"bench-scale-{n}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        ("engines", n),
        ("all Available after the first apply (s)", result.get("allAvailableSeconds")),
        ("all Available after the last apply was accepted (s)", result.get("allAvailableAfterLastApplySeconds")),
        (f"  applying them ({result.get('applyMode')}) (s)", result.get("applySeconds")),
        ("operator CPU during rollout (s)", result.get("rolloutOperatorCpuSeconds")),
        ("operator peak RSS (MB)", result.get("operatorPeakRssMB")),
        ("API requests/min while idle (operator, excl. status patches)", result.get("idleApiRequestsPerMinute")),
        ("status patches/min while idle", result.get("idleStatusPatchesPerMinute")),
        ("operator CPU while idle (s per min)", result.get("idleOperatorCpuSecondsPerMinute")),
        ("restart settle (s)", result.get("restartSettleSeconds")),
        ("writes during restart settle (excl. status)", result.get("restartWritesTotal")),
        ("build Jobs", result.get("buildJobs")),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'figure':<{width}} | value\n{'-' * width}-|------")
    for name, value in rows:
        print(f"{name:<{width}} | {value}")
    print("\nidle API requests/min attributed to the operator, by verb and resource:")
    for k, v in list(result.get("idleApiRequestsByVerbResource", {}).items())[:15]:
        print(f"  {k:<40} {v}")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
