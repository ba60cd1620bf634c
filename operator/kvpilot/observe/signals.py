"""Where an engine's tuning signals come from: its serving pods, or a Prometheus server.

``autotune.metrics.source: Pod`` (the default): the operator samples each warm serving pod between reconciles
(``EngineSampler``, observe/scrape.py) and summarizes the samples of the last interval when a pass asks.
``source: Prometheus``: the server keeps the history, and a pass queries it once (observe/prometheus.py); nothing
is sampled. ``MetricsSource`` holds what both share across engines, the HTTP session and the bound on scrapes at
once, and picks the source from the spec; each engine's samples stay in its own ``EngineSampler``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone

import aiohttp

from kvpilot import defaults, telemetry
from kvpilot.api.metrics_url import MetricsPin
from kvpilot.api.models import AutotuneSpec, InferenceEngine, InferenceEngineSpec
from kvpilot.api.status import EngineStatus
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import PodState
from kvpilot.observe.prometheus import query_prometheus
from kvpilot.observe.scrape import EngineFacts, EngineSampler, is_warm
from kvpilot.trtllm.metrics import MetricsRejected

log = logging.getLogger(__name__)


def from_prometheus(tune: AutotuneSpec) -> bool:
    """Whether the engine's signals come from a Prometheus server (a URL given) rather than its pods."""
    return tune.metrics.source == "Prometheus" and bool(tune.metrics.url)


def engine_time(window: KvWindow | None, spec: InferenceEngineSpec) -> KvWindow | None:
    """The window's arrival rate in the served engine's own time. kvsim pods (the simulated backend) run their
    clock ``speedupRatio`` times faster than the wall clock the sampler measures, and the tuner's what-if
    replays the traffic on the same engine model: without this, it would simulate ``speedupRatio`` times the
    load. A real engine's clock is the wall clock."""
    sim = spec.runtime.simulation
    ratio = sim.speedup_ratio if spec.runtime.backend == "simulated" and sim is not None else 1
    if window is None or ratio <= 1 or window.arrival_rate <= 0:
        return window
    return replace(window, arrival_rate=window.arrival_rate / ratio)


def at_most_replicas(window: KvWindow | None, replicas: int) -> KvWindow | None:
    """The window, unless more pods reported than the engine has replicas: then no decision comes from it (an
    empty window the tuner holds on, saying why). Only the engine's own pods are sampled or queried
    (observe/lineage.py); this is the bound on what still gets through (issue 22)."""
    if window is None or window.pods <= max(replicas, 0):
        return window
    note = f"{window.pods} pods reported, more than the engine runs ({replicas}): no decision is taken from them"
    return replace(window, samples=0, rejected_samples=window.samples + window.rejected_samples, rejection=note)


class MetricsSource:
    """The signal source of every engine: pod sampling between passes, the window (or the query) at a pass."""

    def __init__(self, pins: tuple[MetricsPin, ...] = (), wall_clock: Callable[[], float] = time.time,
                 concurrent_scrapes: int = defaults.CONCURRENT_SCRAPES) -> None:
        """``pins``: addresses for metrics URLs (``kvpilot run --resolve``). ``wall_clock`` (seconds since the
        epoch) dates pod ages (warmup) and samples; a test gives a fake date."""
        self.pins = pins
        self.wall_clock = wall_clock
        self.scrape_slots = asyncio.Semaphore(concurrent_scrapes)  # every engine's pods at once, but bounded
        self._session: aiohttp.ClientSession | None = None

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall_clock(), timezone.utc)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def sample(self, sampler: EngineSampler, spec: InferenceEngineSpec, pods: Sequence[PodState],
                     status: EngineStatus) -> None:
        """Scrape the engine's warm pods once into ``sampler`` (nothing for the Prometheus source). ``status``
        is the engine's stored status: samples that contradict its engine are ignored."""
        tune = spec.autotune
        if from_prometheus(tune):
            return  # the server keeps the history; queried once per reconcile
        async with self.scrape_slots:
            await sampler.tick(
                self.session(), list(pods), port=spec.serving.port, now=self.now(),
                warmup_seconds=tune.warmup_seconds, want_latency=True, facts=EngineFacts.from_status(status),
            )

    async def window(self, sampler: EngineSampler, engine: InferenceEngine,
                     pods: Sequence[PodState], pod_limit: int | None = None) -> KvWindow | None:
        """The tuner's window for a pass: None with autotune off, or when the Prometheus server cannot answer.
        ``pod_limit``: the most pods the engine may run now (its replicas, plus the surge of a rollout); a window
        from more pods feeds no decision. None: the spec's replicas."""
        limit = engine.spec.serving.replicas if pod_limit is None else pod_limit
        tune = engine.spec.autotune
        if not tune.enabled:
            return None
        slo = tune.slo
        ttft = slo.time_to_first_token_millis if slo else None
        tpot = slo.time_per_output_token_millis if slo else None
        if not from_prometheus(tune):
            window = sampler.window(tune.interval_seconds, ttft, tpot)
            return engine_time(at_most_replicas(window, limit), engine.spec)
        # Only the warm pods of today's configuration count, as for the Pod source (Prometheus still has the old
        # pods' samples for a while after a rollout).
        now = self.now()
        live = {p.name for p in pods if is_warm(p, now, tune.warmup_seconds)}
        try:
            window = await query_prometheus(self.session(), tune.metrics.url or "", engine.meta.namespace,
                                            engine.meta.name, tune.interval_seconds, live, ttft, tpot,
                                            pins=self.pins)
            return at_most_replicas(window, limit)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if isinstance(exc, MetricsRejected):
                telemetry.METRICS_REJECTED.labels(reason=exc.reason).inc()
            log.warning("Could not query Prometheus for InferenceEngine %s: %s", engine.meta.name, exc)
            return None

    async def canary_windows(self, sampler: EngineSampler, engine: InferenceEngine,
                             pods: Sequence[PodState]) -> tuple[KvWindow | None, KvWindow | None]:
        """The windows of a canary pod and of the other pods over the same interval (autotune/canary.py), each
        in the engine's own time; (None, None) without a canary pod or with autotune off."""
        tune = engine.spec.autotune
        canary = {p.name for p in pods if p.canary}
        if not tune.enabled or not canary:
            return None, None
        others = {p.name for p in pods if not p.canary}
        slo = tune.slo
        ttft = slo.time_to_first_token_millis if slo else None
        tpot = slo.time_per_output_token_millis if slo else None
        if not from_prometheus(tune):
            return (engine_time(sampler.window(tune.interval_seconds, ttft, tpot, only=canary), engine.spec),
                    engine_time(sampler.window(tune.interval_seconds, ttft, tpot, only=others), engine.spec))
        now = self.now()
        warm = {p.name for p in pods if is_warm(p, now, tune.warmup_seconds)}
        try:
            windows = [await query_prometheus(self.session(), tune.metrics.url or "", engine.meta.namespace,
                                              engine.meta.name, tune.interval_seconds, group & warm, ttft, tpot,
                                              pins=self.pins) for group in (canary, others)]
            return windows[0], windows[1]
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("Could not query Prometheus for the canary of InferenceEngine %s: %s", engine.meta.name, exc)
            return None, None
