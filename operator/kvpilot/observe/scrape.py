"""Scrapes the serving pods' KV-cache metrics into a per-engine window.

trtllm-serve's ``/metrics`` drains its iteration-stats queue on every read, so exactly one poller may
read each pod: this sampler, owned by the operator. (Prometheus should scrape ``/prometheus/metrics``,
which does not drain.) Pods younger than ``warmupSeconds`` are skipped: cold caches and CUDA-graph
capture mislead any capacity model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import aiohttp

from kvpilot.api.metrics_url import resolved_problem
from kvpilot.desired.observed import KvWindow, PodState
from kvpilot.observe.window import summarize
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, parse_iteration_stats, parse_prometheus

log = logging.getLogger(__name__)
TIMEOUT = aiohttp.ClientTimeout(total=5)


def _age_seconds(pod: PodState, now: datetime) -> float:
    if not pod.started_at:
        return 0.0
    started = datetime.strptime(pod.started_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    return (now - started).total_seconds()


@dataclass
class EngineSampler:
    """The samples of one engine's pods, kept for one tuning interval."""

    samples: dict[str, deque[IterationSample]] = field(default_factory=dict)
    latency: dict[str, deque[LatencySnapshot]] = field(default_factory=dict)
    taken_at: dict[str, deque[float]] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget everything (after a rollout: old pods' numbers describe another configuration)."""
        self.samples.clear()
        self.latency.clear()
        self.taken_at.clear()

    def _prune(self, horizon: float) -> None:
        for pod in list(self.samples):
            q = self.samples[pod]
            while q and q[0].timestamp_s < horizon:
                q.popleft()
            stamps, lat = self.taken_at.get(pod, deque()), self.latency.get(pod, deque())
            while stamps and stamps[0] < horizon:
                stamps.popleft()
                if lat:
                    lat.popleft()

    async def tick(
        self, session: aiohttp.ClientSession, pods: list[PodState], port: int, now: datetime,
        warmup_seconds: int, want_latency: bool,
    ) -> None:
        live = {p.name for p in pods}
        for gone in set(self.samples) - live:
            self.samples.pop(gone, None)
            self.latency.pop(gone, None)
            self.taken_at.pop(gone, None)
        wall = time.time()
        warm = [p for p in pods if p.ready and p.ip and not p.deleting and _age_seconds(p, now) >= warmup_seconds]
        # Concurrently: one unreachable pod must not hold up the others (or the engine's reconcile).
        await asyncio.gather(*(self._scrape(session, pod, port, wall, want_latency) for pod in warm))

    async def _scrape(
        self, session: aiohttp.ClientSession, pod: PodState, port: int, wall: float, want_latency: bool
    ) -> None:
        base = f"http://{pod.ip}:{port}"
        try:
            async with session.get(f"{base}/metrics", timeout=TIMEOUT) as resp:
                payload: Any = await resp.json(content_type=None)
            self.samples.setdefault(pod.name, deque()).extend(parse_iteration_stats(payload, wall))
            if want_latency:
                async with session.get(f"{base}/prometheus/metrics", timeout=TIMEOUT) as resp:
                    _sample, snap = parse_prometheus(await resp.text(), wall)
                self.latency.setdefault(pod.name, deque()).append(snap)
                self.taken_at.setdefault(pod.name, deque()).append(wall)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("Could not scrape metrics from Pod %s: %s", pod.name, exc)

    def window(
        self, interval_seconds: float, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None
    ) -> KvWindow | None:
        self._prune(time.time() - interval_seconds)
        return summarize(
            {p: list(q) for p, q in self.samples.items()},
            {p: list(q) for p, q in self.latency.items()},
            window_seconds=interval_seconds,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
        )


async def query_prometheus(
    session: aiohttp.ClientSession, url: str, namespace: str, pod_prefix: str, interval_seconds: int
) -> KvWindow | None:
    """The same window from a Prometheus server that scrapes ``/prometheus/metrics`` through the chart's
    PodMonitor (which copies the pod label serving.kvpilot.io/engine into ``engine``).

    It needs the trtllm_* iteration gauges (KV blocks, running and waiting requests): kvsim serves them;
    TensorRT-LLM 1.2's collector serves fewer (docs/trtllm-sources.md §6), in which case the window is empty
    and the tuner holds — use ``source: Pod`` there."""
    sel = f'namespace="{namespace}",engine="{pod_prefix}"'
    rng = f"[{max(interval_seconds, 30)}s]"
    queries = {
        "used": f"max_over_time(trtllm_kv_cache_used_blocks{{{sel}}}{rng})",
        "max": f"max_over_time(trtllm_kv_cache_max_blocks{{{sel}}}{rng})",
        "tpb": f"max_over_time(trtllm_kv_cache_tokens_per_block{{{sel}}}{rng})",
        "active": f"max_over_time(trtllm_num_requests_running{{{sel}}}{rng})",
        "queued": f"avg_over_time(trtllm_num_requests_waiting{{{sel}}}{rng})",
        "paused": f"max_over_time(trtllm_num_paused_requests{{{sel}}}{rng})",
        "runtime": f"max_over_time(trtllm_max_batch_size_runtime{{{sel}}}{rng})",
        "samples": f"count_over_time(trtllm_kv_cache_max_blocks{{{sel}}}{rng})",
    }
    # Checked again here, not only at admission: a CRD installed before the rule, or a Service name that
    # resolves to the metadata address, must not turn the operator into an SSRF proxy. No redirects either.
    problem = await asyncio.to_thread(resolved_problem, url)
    if problem:
        raise ValueError(f"autotune.metrics.url {url[:200]!r} refused: {problem}")
    values: dict[str, dict[str, float]] = {}
    for key, q in queries.items():
        async with session.get(f"{url.rstrip('/')}/api/v1/query", params={"query": q}, timeout=TIMEOUT,
                               allow_redirects=False) as resp:
            values[key] = parse_vector(await resp.json())
    wall = time.time()
    samples = {
        pod: [
            IterationSample(
                timestamp_s=wall,
                used_blocks=int(values["used"].get(pod, 0)),
                max_blocks=int(values["max"].get(pod, 0)),
                tokens_per_block=int(values["tpb"].get(pod, 0)),
                active_requests=int(values["active"].get(pod, 0)),
                queued_requests=round(values["queued"].get(pod, 0)),
                paused_requests=int(values["paused"].get(pod, 0)),
                max_batch_size_runtime=int(values["runtime"].get(pod, 0)),
                max_batch_size_static=0,
            )
        ]
        for pod in values["max"]
    }
    window = summarize(samples, window_seconds=interval_seconds)
    if window is None:
        return None
    # Each pod's row summarizes every scrape in the range: count those, not the rows.
    return replace(window, samples=int(sum(values["samples"].values())))


def parse_vector(body: dict[str, Any]) -> dict[str, float]:
    """A Prometheus instant-vector response -> {pod: value}."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus query failed: {body.get('error', body)}")
    out = {}
    for item in body.get("data", {}).get("result", []):
        pod = item.get("metric", {}).get("pod", "")
        out[pod] = float(item["value"][1])
    return out
