"""Scrapes the serving pods' KV-cache metrics into a per-engine window.

trtllm-serve's ``/metrics`` drains its iteration-stats queue on every read, so exactly one poller may
read each pod: this sampler, owned by the operator. (Prometheus should scrape ``/prometheus/metrics``,
which does not drain; ``source: Prometheus`` reads the window from there: observe/prometheus.py.) Pods younger than ``warmupSeconds`` are skipped: cold caches and CUDA-graph
capture mislead any capacity model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

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


def is_warm(pod: PodState, now: datetime, warmup_seconds: int) -> bool:
    """A pod whose numbers describe the configuration: ready, reachable, not leaving, past its warmup."""
    return bool(pod.ready and pod.ip and not pod.deleting and _age_seconds(pod, now) >= warmup_seconds)


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
        warm = [p for p in pods if is_warm(p, now, warmup_seconds)]
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
