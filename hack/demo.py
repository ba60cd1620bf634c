"""``make demo``: kvpilot's closed loop on a local cluster, for a person to watch.

1. builds (or reuses) the control plane and starts it: etcd, kube-apiserver, controller-manager, scheduler,
   kwok with fake H100 nodes, and the local kubelet that runs simulated pods as processes;
2. installs the Helm chart and runs the operator under the chart's ServiceAccount;
3. applies a simulated InferenceEngine whose runtime max_batch_size starts far too small (4);
4. the engine is built by a real Job (kvsim's trtllm-build), served by two pods (kvsim's trtllm-serve);
5. drives OpenAI traffic at them through a gateway that follows the Service's ready endpoints (pods drain
   before they stop, so retunes lose no request) and prints what clients see next to what the operator decides;
6. prints a summary: the decisions, their reasons, and client latency before and after.

Usage: python -m hack.demo [--rate 24] [--seconds 150] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from hack import closedloop as C
from hack import operatorimage

NS, NAME = "kvpilot-demo", "llama-sim"
SLO_TTFT_MS = 1000


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def status_line(stats: C.LoadStats, t0: float) -> str:
    st = C.get_engine(NS, NAME).get("status", {})
    b = st.get("batching", {})
    rec = st.get("autotune", {}).get("recommendation", {})
    kv = st.get("kvCache", {})
    w = stats.window(time.time() - 10, SLO_TTFT_MS)
    return (f"[{time.time() - t0:5.0f}s] batch {b.get('summary', '?'):>8}  KV {kv.get('utilizationPercent', 0):3}%  "
            f"waiting {kv.get('waitingRequests', 0):4}  | clients: {w['requests']:4} done/10s, p95 TTFT "
            f"{w['ttftP95Ms']:7.0f} ms, {w['missShare'] * 100 if w['requests'] else 0:5.1f}% over {SLO_TTFT_MS} ms"
            f"  | tuner: {rec.get('action', '-')} {rec.get('reason', '')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=24.0, help="Requests per second sent to the engine.")
    parser.add_argument("--seconds", type=float, default=150.0, help="How long to drive traffic.")
    parser.add_argument("--keep", action="store_true", help="Leave the demo namespace and operator logs in place.")
    args = parser.parse_args()

    step("Local control plane (first run builds Kubernetes from the Go module proxy: ~8 min on 2 cores)")
    C.cluster.ensure_cluster_up()
    print(C.cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product"))
    step("Installing the Helm chart (CRD, RBAC, ServiceAccount) and starting the operator as that account")
    C.install_chart()
    logdir = Path(tempfile.mkdtemp(prefix="kvpilot-demo-"))
    op, how = operatorimage.make_operator(logdir, C.OPERATOR_NS, C.KVSIM_IMAGE,
                                          f"ghcr.io/kvpilot/kvpilot:{C.KVSIM_IMAGE.rsplit(':', 1)[1]}")
    op.start()
    print(f"operator running as {how} (logs: {op.log_path})")
    try:
        step(f"Applying InferenceEngine {NS}/{NAME}: simulated Llama-3.1-8B FP8 on H100, runtime max_batch_size 4")
        C.delete_namespace(NS)
        C.create_namespace(NS)
        C.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(C.closed_loop_engine(NS, NAME, 4, 2)))
        print(C.cluster.kubectl("wait", "--for=condition=Available", f"ie/{NAME}", "-n", NS, "--timeout=300s"))
        print(C.cluster.kubectl("get", "ie,jobs,deployments,pods", "-n", NS, "-o", "wide"))
        step(f"Driving {args.rate:g} req/s of OpenAI completions for {args.seconds:g}s (TTFT objective {SLO_TTFT_MS} ms)")
        stats, t0, done = C.LoadStats(), time.time(), threading.Event()

        def watch() -> None:
            while not done.wait(5):
                print(status_line(stats, t0), flush=True)

        threading.Thread(target=watch, daemon=True).start()
        with C.service_gateway(NS, NAME) as gateway:  # routes like a gateway: the Service's ready endpoints
            asyncio.run(C.generate_load(gateway.endpoints, args.rate, args.seconds, 200, 200, stats))
        done.set()
        summarize(stats, t0)
    finally:
        op.stop()
        if not args.keep:
            C.delete_namespace(NS)
    return 0


def summarize(stats: C.LoadStats, t0: float) -> None:
    step("Summary")
    engine = C.get_engine(NS, NAME)
    print(C.cluster.kubectl("get", "ie", NAME, "-n", NS))
    for h in reversed(engine["status"].get("autotune", {}).get("history", [])):
        print(f"  {h['at']}  {h['action']:6} {h['fromBatchSize']:>4} -> {h['toBatchSize']:<4} {h['reason']}: "
              f"{h['message'][:160]}")
    times = [at for at, _ in stats.ttft_ms]
    if times:
        half = min(times) + (max(times) - min(times)) / 2
        first, last = stats.window(0, SLO_TTFT_MS), stats.window(half, SLO_TTFT_MS)
        early = [t for at, t in stats.ttft_ms if at < min(times) + 20]
        if early:
            early.sort()
            print(f"  clients, first 20 s:  p95 TTFT {early[int(0.95 * (len(early) - 1))]:.0f} ms")
        print(f"  clients, second half: p95 TTFT {last['ttftP95Ms']:.0f} ms, {last['missShare']:.1%} over the objective")
        print(f"  clients, whole run:   {stats.sent} sent, {stats.ok} ok, {stats.errors} failed, "
              f"{first['missShare']:.1%} over the objective")
    print(f"\nThe runtime max_batch_size lives in status.batching (spec still says "
          f"{engine['spec']['batching']['maxBatchSize']}); `kubectl describe ie {NAME} -n {NS}` shows the events.")


if __name__ == "__main__":
    sys.exit(main())
