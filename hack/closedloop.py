"""The closed loop on the local cluster, shared by ``make demo`` and the end-to-end test.

Pieces: the operator as a local process under the chart's ServiceAccount (so RBAC is what a cluster
install gets), a namespace with a hostPath engine cache, and an OpenAI load generator with Poisson
arrivals, streaming, and least-outstanding balancing that routes like a gateway: to the ready endpoints
of the engine's Service, followed as pods come and go (hack/gateway.py; the local cluster has no
kube-proxy and no EndpointSlices, see docs/testenv.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import yaml

from hack.gateway import ServiceGateway, ready_addresses
from hack.testenv import cluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

OPERATOR_NS = "kvpilot-system"
# The images' tag: KVPILOT_IMAGE_VERSION as hack/images/build.sh used it (e.g. a branch's own build), else
# kvpilot's version. The chart runs the operator image with the same tag.
IMAGE_TAG = os.environ.get("KVPILOT_IMAGE_VERSION") or __import__("kvpilot").__version__
KVSIM_IMAGE = f"ghcr.io/kvpilot/kvsim:{IMAGE_TAG}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_chart() -> None:
    cluster.helm("upgrade", "--install", "kvpilot", str(ROOT / "charts/kvpilot"), "-n", OPERATOR_NS,
                 "--create-namespace", "--set", f"kvsimImage.tag={IMAGE_TAG}", "--set", f"image.tag={IMAGE_TAG}")
    cluster.wait_condition("crd/inferenceengines.serving.kvpilot.io", "Established", timeout_s=60)
    deadline = time.monotonic() + 60
    while cluster.kubectl("explain", "inferenceengine.spec", check=False).strip() == "":
        if time.monotonic() > deadline:
            raise RuntimeError("the InferenceEngine OpenAPI never appeared")
        time.sleep(1)


class OperatorProcess:
    """kvpilot run as a local process authenticated as the chart's ServiceAccount."""

    def __init__(self, logdir: Path, resync_seconds: float = 3.0):
        self.logdir = logdir
        self.resync_seconds = resync_seconds
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.extra_args: list[str] = []  # more `kvpilot run` flags, for the next start
        self.kubeconfig = cluster.serviceaccount_kubeconfig(OPERATOR_NS, "kvpilot", logdir / "sa.kubeconfig")

    @property
    def log_path(self) -> Path:
        return self.logdir / f"operator-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.health = free_port()
        # /metrics on every local address, as in a pod: Prometheus reaches it at the chart's operator pod IP
        # (a loopback address on this host), through the metrics Service and its ServiceMonitor.
        self.metrics = getattr(self, "metrics", 0) or free_port()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.cli", "run", "--all-namespaces", "--metrics-port", str(self.metrics),
             "--health-port", str(self.health), "--resync-seconds", str(self.resync_seconds),
             "--kvsim-image", KVSIM_IMAGE, *self.extra_args],
            env=env, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while not self.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the operator's /healthz never answered:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.5)

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logdir.glob("operator-*.log")))


def create_namespace(ns: str) -> None:
    """A namespace with a hostPath PersistentVolume pre-bound to <ns>/engines (no storage provisioner here)."""
    path = cluster.testenv_dir() / "volumes" / ns / "engines"
    path.mkdir(parents=True, exist_ok=True)
    cluster.kubectl("create", "namespace", ns, check=False)
    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-engines"},
         "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(path)},
                  "claimRef": {"namespace": ns, "name": "engines"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "engines", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{ns}-engines",
                  "resources": {"requests": {"storage": "100Gi"}}}},
    ]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


def delete_namespace(ns: str, reuse_name: bool = True) -> None:
    """Delete the namespace. ``reuse_name`` (``make demo``): wait until the namespace is gone, so that its name can
    be created again. Otherwise (a test's namespace, whose name is never used again) wait for its pods only.

    Why a test's namespace waits for its pods only: the pods are what the next test shares with it (the fake nodes'
    GPUs, the machine's CPU); the namespace object goes later, on its own. kube-controller-manager's namespace
    controller takes a namespace up 5 s after each change to it and, while content remains, again only after half the
    longest grace period of its pods still running (kubernetes v1.36, pkg/controller/namespace/namespace_controller.go),
    so the namespace outlives pods the local kubelet stopped in seconds: waiting for it cost each e2e teardown 15.6 s in
    CI (about twenty of them)."""
    cluster.kubectl("delete", "inferenceengines", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)
    if reuse_name:
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=90s", check=False)
    else:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", ns, "--timeout=90s", check=False)
    cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)


def discard_namespace(ns: str) -> None:
    """Delete a test's namespace, waiting for its pods only (``delete_namespace`` with ``reuse_name=False``)."""
    delete_namespace(ns, reuse_name=False)


def get_engine(ns: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "inferenceengine", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out) if out.strip().startswith("{") else {}


def ready_endpoints(ns: str, name: str) -> list[str]:
    """The ready endpoints of the engine's Service, as the endpoints controller would publish them."""
    svc = json.loads(cluster.kubectl("get", "service", name, "-n", ns, "-o", "json"))
    selector = ",".join(f"{k}={v}" for k, v in svc["spec"].get("selector", {}).items())
    pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))
    return ready_addresses(svc, pods["items"], "http")


def service_gateway(ns: str, name: str) -> ServiceGateway:
    """A gateway following the engine's Service (the Service has the engine's name)."""
    return ServiceGateway(ns, name, "http", kubeconfig=str(cluster.kubeconfig_path()))


@dataclass
class LoadStats:
    """Client-side view: what users of the engine experienced, window by window."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    ttft_ms: list[tuple[float, float]] = field(default_factory=list)  # (finish wall time, ttft)

    def window(self, since: float, slo_ttft_ms: float) -> dict[str, float]:
        recent = sorted(t for at, t in self.ttft_ms if at >= since)
        if not recent:
            return {"requests": 0, "ttftP95Ms": float("nan"), "missShare": float("nan")}
        p95 = recent[min(len(recent) - 1, int(0.95 * len(recent)))]
        return {"requests": len(recent), "ttftP95Ms": p95,
                "missShare": sum(1 for t in recent if t > slo_ttft_ms) / len(recent)}


async def _one(session: aiohttp.ClientSession, endpoint: str, prompt_words: int, max_tokens: int,
               stats: LoadStats, outstanding: dict[str, int], fallback: Callable[[str], str | None]) -> None:
    try:
        await _send(session, endpoint, prompt_words, max_tokens, stats, outstanding)
    except aiohttp.ClientConnectorError:
        # Like a gateway, retry a refused connection (a pod that just stopped accepting) on another pod once.
        other = fallback(endpoint)
        if other is None:
            stats.errors += 1
            return
        try:
            await _send(session, other, prompt_words, max_tokens, stats, outstanding)
        except aiohttp.ClientConnectorError:
            stats.errors += 1


# Words for prompts no two of which share a prefix (distinct_prompt).
PROMPT_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
                "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")


def distinct_prompt(rng: random.Random, words: int) -> str:
    """A prompt of ``words`` random words. Every prompt is distinct: kvsim, like TensorRT-LLM, reuses the KV
    blocks of a repeated prefix, so identical prompts would cost no prefill (and show no TPOT cliff)."""
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(words))


async def closed_loop_clients(clients: int, endpoints: Callable[[], list[str]], stop: Callable[[], bool],
                              send: Callable[[aiohttp.ClientSession, list[str], random.Random], Awaitable[None]],
                              seed: int = 18) -> None:
    """``clients`` clients, each calling ``send`` (one request to the ready ``endpoints``) again as soon as its
    last one finished, like a batch job or a gateway with a concurrency cap, until ``stop()`` says so (polled
    every 2 s, in a thread: it may call kubectl)."""
    rng = random.Random(seed)
    done = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            targets = endpoints()
            if not targets:
                await asyncio.sleep(0.2)
                continue
            await send(session, targets, rng)

    async def watch() -> None:
        while not await asyncio.to_thread(stop):
            await asyncio.sleep(2)
        done.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        await asyncio.gather(watch(), *(client(session) for _ in range(clients)))


async def stream_completion(session: aiohttp.ClientSession, endpoint: str, prompt: str, max_tokens: int,
                            stats: LoadStats) -> None:
    """One streamed /v1/completions request to ``endpoint``: its TTFT into ``stats``, an error counted. A refused
    connection is raised (the pod is gone: the caller picks another endpoint or counts it)."""
    body = {"model": "model", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    start = time.monotonic()
    first = None
    try:
        async with session.post(f"http://{endpoint}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=300)) as resp:
            if resp.status != 200:
                stats.errors += 1
                return
            async for line in resp.content:
                if first is None and line.startswith(b"data:") and b"[DONE]" not in line:
                    first = time.monotonic()
        stats.ok += 1
        if first is not None:
            stats.ttft_ms.append((time.time(), (first - start) * 1000))
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError):
        stats.errors += 1


async def _send(session: aiohttp.ClientSession, endpoint: str, prompt_words: int, max_tokens: int,
                stats: LoadStats, outstanding: dict[str, int]) -> None:
    outstanding[endpoint] = outstanding.get(endpoint, 0) + 1
    try:
        await stream_completion(session, endpoint, " ".join(["hello"] * prompt_words), max_tokens, stats)
    finally:
        outstanding[endpoint] -= 1


# A late wake-up sends the arrivals that fell due, up to this many seconds of them (a suspended process would
# otherwise send everything it missed at once).
MAX_CATCH_UP_SECONDS = 1.0


async def generate_load(endpoints: Callable[[], list[str]], rate: float, seconds: float, prompt_words: int,
                        max_tokens: int, stats: LoadStats, seed: int = 1, refresh_s: float = 0.25,
                        stop: Callable[[], bool] | None = None) -> None:
    """Poisson arrivals at ``rate`` req/s for ``seconds`` (or until ``stop()``), each to the ready endpoint with
    the fewest in flight. Every request opens its own connection, so no request is ever sent on a kept-alive
    connection that a draining server is closing.

    The arrival times are drawn in advance and kept to on the clock: a loop that wakes late (a loaded machine)
    sends what fell due at once (up to MAX_CATCH_UP_SECONDS of them), so the rate offered is ``rate`` however
    slow the machine. ``endpoints`` (re-read every ``refresh_s``) and ``stop`` (checked after a lookup, a second
    or more apart) may call kubectl: they run in a thread beside the arrivals, never between them (awaited in
    line, each call stalled the arrivals for its duration, so a loaded machine's slow kubectl cut the rate
    offered: no queue formed, and the tuner had no cause to raise). An exception from either ends the arrivals
    and is raised here."""
    rng = random.Random(seed)
    outstanding: dict[str, int] = {}
    tasks: set[asyncio.Task[None]] = set()
    state = {"targets": await asyncio.to_thread(endpoints)}
    done = asyncio.Event()

    async def follow() -> None:  # the endpoints and the stop condition, off the arrivals' path
        checked = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(done.wait(), timeout=refresh_s)
                return  # the arrivals ended: no lookup after them (a stop may patch the engine)
            except TimeoutError:
                pass
            state["targets"] = await asyncio.to_thread(endpoints)
            if stop is not None and not done.is_set() and time.monotonic() - checked > 1:
                checked = time.monotonic()
                if await asyncio.to_thread(stop):
                    return

    follower = asyncio.create_task(follow())
    follower.add_done_callback(lambda _: done.set())  # stopped, or a lookup raised: the arrivals end either way
    begin = time.monotonic()
    due = begin + rng.expovariate(rate)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        try:
            while due < begin + seconds and not done.is_set():
                wait = due - time.monotonic()
                if wait > 0:
                    try:
                        await asyncio.wait_for(done.wait(), timeout=wait)
                        break  # stopped
                    except TimeoutError:
                        pass
                elif -wait > MAX_CATCH_UP_SECONDS:  # a process paused for long: no burst of all it missed
                    due = time.monotonic()
                due += rng.expovariate(rate)
                targets = state["targets"]
                if not targets:
                    stats.errors += 1
                    continue
                target = min(targets, key=lambda e: outstanding.get(e, 0))
                stats.sent += 1

                def fallback(failed: str, pool: list[str] = targets) -> str | None:
                    others = [e for e in pool if e != failed]
                    return min(others, key=lambda e: outstanding.get(e, 0)) if others else None

                task = asyncio.create_task(_one(session, target, prompt_words, max_tokens, stats, outstanding,
                                                fallback))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            done.set()
            (failure,) = await asyncio.gather(follower, return_exceptions=True)
        if tasks:
            await asyncio.wait(tasks, timeout=120)
    if isinstance(failure, BaseException):
        raise failure  # a lookup that failed fails the caller, as it did when it ran in line


def slower_l4_engine(ns: str, name: str, start_batch: int, replicas: int, perturb: str) -> dict[str, Any]:
    """A closed-loop engine (``closed_loop_engine``) whose kvsim L4 pods (Llama-3.1-8B FP8, built for 64) serve an
    engine other than their profile (``KVSIM_PERTURB``, e.g. ``decode=0.8,per_seq=1.5``: the tuner's model starts
    from the profile), playing TensorRT-LLM 1.3, whose TensorRT backend serves the latency histograms the tuner,
    its verification and a canary read (1.2's does not: without them a TPOT cliff is invisible)."""
    doc = closed_loop_engine(ns, name, start_batch=start_batch, replicas=replicas, cooldown_seconds=60)
    spec = doc["spec"]
    spec["runtime"] = {"backend": "simulated", "simulation": {"profile": "llama-3.1-8b-fp8-l4"},
                       "env": [{"name": "KVSIM_PERTURB", "value": perturb},
                               {"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3"}]}
    spec["build"]["maxBatchSize"] = 64
    spec["serving"]["gpuProduct"] = "NVIDIA-L4"
    return doc


def closed_loop_engine(ns: str, name: str, start_batch: int, replicas: int,
                       cooldown_seconds: int = 60) -> dict[str, Any]:
    """A simulated engine that starts with a deliberately small runtime batch limit, tuned in Auto mode."""
    return {
        "apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                      "revision": "0e9e39f249a16976918f6564b8830bc894c89659", "architecture": "llama"},
            "runtime": {"backend": "simulated", "simulation": {"profile": "llama-3.1-8b-fp8-h100"}},
            "build": {"quantization": "fp8", "kvCacheDtype": "fp8", "maxBatchSize": 256},
            "batching": {"maxBatchSize": start_batch},
            "serving": {"replicas": replicas, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            "engineCache": {"claimName": "engines"},
            "autotune": {"mode": "Auto", "minBatchSize": 4, "maxBatchSize": 256, "intervalSeconds": 10,
                         "cooldownSeconds": cooldown_seconds, "warmupSeconds": 5,
                         "slo": {"timeToFirstTokenMillis": 1000, "timePerOutputTokenMillis": 50}},
        },
    }
