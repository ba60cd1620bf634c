"""``make demo``: kvpilot's closed loop on a local cluster, for a person to watch.

1. builds (or reuses) the control plane and starts it: etcd, kube-apiserver, controller-manager, scheduler,
   kwok with fake H100 nodes, and the local kubelet that runs simulated pods as processes;
2. installs the Helm chart and runs the operator under the chart's ServiceAccount;
3. applies a simulated InferenceEngine on a KV-scarce GPU (Llama-3.1-8B FP8 on a 24 GB L4: the pool holds
   ~180k tokens) whose runtime max_batch_size starts at 64, as an engineer would ("start at 64, watch
   memory, raise slowly");
4. the engine is built by a real Job (kvsim's trtllm-build), served by two pods (kvsim's trtllm-serve);
5. drives OpenAI traffic with long outputs at them (800-token prompts, 600-token outputs, distinct requests:
   block reuse off) through a gateway that follows the Service's ready endpoints (pods drain before they
   stop, so retunes lose no request) and prints what clients see next to what the operator decides;
6. prints a summary: the decisions, their reasons, the KV pool at each limit, and client latency.

Usage: python -m hack.demo [--rate 4.4] [--seconds 360] [--keep]
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
from typing import Any

from hack import closedloop as C
from hack import operatorimage

NS, NAME = "kvpilot-demo", "llama-sim"
SLO_TTFT_MS, SLO_TPOT_MS = 2000, 100
PROFILE, GPU = "llama-3.1-8b-fp8-l4", "NVIDIA-L4"  # hack/testenv/nodes.yaml has a kwok node of L4s
START_BATCH, PROMPT_WORDS, MAX_TOKENS = 64, 800, 600


def demo_engine() -> dict[str, Any]:
    """The closed-loop engine on an L4, starting at 64, with objectives an L4 can meet (TPOT ~60-70 ms)."""
    doc = C.closed_loop_engine(NS, NAME, START_BATCH, 2)
    spec = doc["spec"]
    spec["runtime"]["simulation"]["profile"] = PROFILE
    spec["serving"]["gpuProduct"] = GPU
    spec["build"]["maxBatchSize"] = 512
    spec["batching"]["enableBlockReuse"] = False  # the demo's prompts are identical: keep them distinct in KV
    spec["autotune"].update({"maxBatchSize": 512, "slo": {"timeToFirstTokenMillis": SLO_TTFT_MS,
                                                          "timePerOutputTokenMillis": SLO_TPOT_MS}})
    return doc


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def status_line(stats: C.LoadStats, t0: float, trace: list[tuple[float, int, int]] | None = None) -> str:
    st = C.get_engine(NS, NAME).get("status", {})
    b = st.get("batching", {})
    rec = st.get("autotune", {}).get("recommendation", {})
    kv = st.get("kvCache", {})
    w = stats.window(time.time() - 10, SLO_TTFT_MS)
    if trace is not None and isinstance(b.get("maxBatchSize"), int) and kv.get("observedAt"):
        trace.append((time.time() - t0, b["maxBatchSize"], int(kv.get("utilizationPercent", 0))))
    return (f"[{time.time() - t0:5.0f}s] batch {b.get('summary', '?'):>8}  KV {kv.get('utilizationPercent', 0):3}%  "
            f"waiting {kv.get('waitingRequests', 0):4}  | clients: {w['requests']:4} done/10s, p95 TTFT "
            f"{w['ttftP95Ms']:7.0f} ms, {w['missShare'] * 100 if w['requests'] else 0:5.1f}% over {SLO_TTFT_MS} ms"
            f"  | tuner: {rec.get('action', '-')} {rec.get('reason', '')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=4.4, help="Requests per second sent to the engine.")
    parser.add_argument("--seconds", type=float, default=360.0, help="How long to drive traffic.")
    parser.add_argument("--keep", action="store_true", help="Leave the demo namespace and operator logs in place.")
    args = parser.parse_args()

    step("Local control plane (first run builds Kubernetes from the Go module proxy: ~8 min on 2 cores)")
    C.cluster.ensure_cluster_up()
    # A cluster started before the L4 node was added lacks it: the fake nodes are declarative, apply them.
    C.cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parent / "testenv" / "nodes.yaml"))
    print(C.cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product"))
    step("Installing the Helm chart (CRD, RBAC, ServiceAccount) and starting the operator as that account")
    C.install_chart()
    logdir = Path(tempfile.mkdtemp(prefix="kvpilot-demo-"))
    op, how = operatorimage.make_operator(logdir, C.OPERATOR_NS, C.KVSIM_IMAGE,
                                          f"ghcr.io/kvpilot/kvpilot:{C.KVSIM_IMAGE.rsplit(':', 1)[1]}")
    op.start()
    print(f"operator running as {how} (logs: {op.log_path})")
    try:
        step(f"Applying InferenceEngine {NS}/{NAME}: simulated Llama-3.1-8B FP8 on {GPU} (24 GB), "
             f"runtime max_batch_size {START_BATCH}")
        C.delete_namespace(NS)
        C.create_namespace(NS)
        C.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(demo_engine()))
        print(C.cluster.kubectl("wait", "--for=condition=Available", f"ie/{NAME}", "-n", NS, "--timeout=300s"))
        print(C.cluster.kubectl("get", "ie,jobs,deployments,pods", "-n", NS, "-o", "wide"))
        step(f"Driving {args.rate:g} req/s of OpenAI completions ({PROMPT_WORDS}-word prompts, {MAX_TOKENS} tokens out) "
             f"for {args.seconds:g}s (objectives: TTFT {SLO_TTFT_MS} ms, TPOT {SLO_TPOT_MS} ms)")
        stats, t0, done = C.LoadStats(), time.time(), threading.Event()
        trace: list[tuple[float, int, int]] = []

        def watch() -> None:
            while not done.wait(5):
                print(status_line(stats, t0, trace), flush=True)

        threading.Thread(target=watch, daemon=True).start()
        with C.service_gateway(NS, NAME) as gateway:  # routes like a gateway: the Service's ready endpoints
            asyncio.run(C.generate_load(gateway.endpoints, args.rate, args.seconds, PROMPT_WORDS, MAX_TOKENS, stats))
        done.set()
        summarize(stats, t0, trace)
    finally:
        op.stop()
        if not args.keep:
            C.delete_namespace(NS)
    return 0


def pool_by_limit(trace: list[tuple[float, int, int]]) -> list[tuple[int, float, float, int]]:
    """(limit, from s, to s, peak KV %) for each runtime limit in force, in order: the pool as the limit rose."""
    out: list[tuple[int, float, float, int]] = []
    for t, limit, kv in trace:
        if out and out[-1][0] == limit:
            out[-1] = (limit, out[-1][1], t, max(out[-1][3], kv))
        else:
            out.append((limit, t, t, kv))
    return out


def summarize(stats: C.LoadStats, t0: float, trace: list[tuple[float, int, int]] | None = None) -> None:
    step("Summary")
    engine = C.get_engine(NS, NAME)
    print(C.cluster.kubectl("get", "ie", NAME, "-n", NS))
    for h in reversed(engine["status"].get("autotune", {}).get("history", [])):
        print(f"  {h['at']}  {h['action']:6} {h['fromBatchSize']:>4} -> {h['toBatchSize']:<4} {h['reason']}: "
              f"{h['message'][:160]}")
    for limit, start, end, kv in pool_by_limit(trace or []):
        print(f"  max_batch_size {limit:>4} from {start:4.0f}s to {end:4.0f}s: KV pool peak {kv:3}% (target 85%)")
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
