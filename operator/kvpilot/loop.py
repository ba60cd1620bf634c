"""One long-lived loop per InferenceEngine: reconcile when woken or due, sample pod metrics in between.

Why not kopf daemons or timers: they require a finalizer on every object, so uninstalling the operator
before deleting the engines would leave them stuck in Terminating. kvpilot needs no cleanup of its own
(owner references let the garbage collector delete every child), so it runs finalizer-free: kopf's
event handlers feed the latest object into these loops and wake them on spec or child changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiohttp

from kvpilot import telemetry
from kvpilot.api.validate import InvalidEngineError
from kvpilot.desired import labels as L
from kvpilot.desired.plan import Settings, requeue_after
from kvpilot.k8s.api import Api
from kvpilot.k8s.errors import ApiError
from kvpilot.observe.prometheus import query_prometheus
from kvpilot.observe.scrape import EngineFacts, EngineSampler, is_warm
from kvpilot.reconcile import engine_from_body, reconcile
from kvpilot.trtllm.metrics import MetricsRejected

log = logging.getLogger(__name__)
ERROR_BACKOFF_SECONDS = (2, 5, 15, 30, 60)


@dataclass
class EngineLoop:
    key: tuple[str, str]
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    generation: int = 0
    sampler: EngineSampler = field(default_factory=EngineSampler)
    parsed: tuple[str, Any] | None = None  # ("uid/generation", InferenceEngine) of the last parse
    wrote_status: bool = False

    def engine(self) -> Any:
        """The typed engine of the latest body, parsed (and defaulted, validated) once per new version."""
        meta = self.body.get("metadata") or {}
        version = f"{meta.get('uid')}/{meta.get('generation')}"
        if self.parsed is None or self.parsed[0] != version:
            self.parsed = (version, engine_from_body(self.body))
        return self.parsed[1]


class EngineLoops:
    """The registry of loops, fed by kopf events."""

    def __init__(self, api: Api, settings: Settings, resync_seconds: float):
        self.api = api
        self.settings = settings
        self.resync_seconds = resync_seconds
        self.loops: dict[tuple[str, str], EngineLoop] = {}
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Called for every watch event of an InferenceEngine."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            loop = self.loops.pop(key, None)
            if loop and loop.task:
                loop.task.cancel()
            telemetry.forget(*key)
            return
        loop = self.loops.get(key)
        if loop is None:
            loop = self.loops[key] = EngineLoop(key=key, body=body)
            loop.task = asyncio.create_task(self._run(loop), name=f"kvpilot:{key[0]}/{key[1]}")
            return
        # The operator is the only writer of status, so once it has written one, a watch event can only carry
        # that status or an older one (events lag): keep ours rather than roll the tuner's bookkeeping back.
        loop.body = {**body, "status": loop.body["status"]} if loop.wrote_status else body
        generation = int(meta.get("generation") or 0)
        if generation != loop.generation:  # spec changed; status-only changes (ours) do not wake
            loop.wake.set()

    def wake_owners(self, child: dict[str, Any]) -> None:
        """A child changed: wake every InferenceEngine that owns it (a shared build Job has several)."""
        meta = child.get("metadata") or {}
        names = {ref.get("name", "") for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "InferenceEngine"}
        names.add((meta.get("labels") or {}).get(L.ENGINE_LABEL, ""))  # pods are owned by ReplicaSets
        for name in names - {""}:
            loop = self.loops.get((meta.get("namespace", ""), name))
            if loop:
                loop.wake.set()

    async def stop_all(self) -> None:
        tasks = [loop.task for loop in self.loops.values() if loop.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _sample(self, loop: EngineLoop, spec: Any, pods: list[Any]) -> None:
        tune = spec.autotune
        if tune.metrics.source == "Prometheus" and tune.metrics.url:
            return  # the server keeps the history; queried once per reconcile
        await loop.sampler.tick(
            self.session(), pods, spec.serving.port, datetime.now(timezone.utc), tune.warmup_seconds, True,
            EngineFacts.from_status(loop.body.get("status")),
        )

    async def _window(self, loop: EngineLoop, engine: Any, pods: list[Any]) -> Any:
        tune = engine.spec.autotune
        if not tune.enabled:
            return None
        slo = tune.slo
        if tune.metrics.source == "Prometheus" and tune.metrics.url:
            # Only the warm pods of today's configuration count, as for the Pod source (Prometheus still has
            # the old pods' samples for a while after a rollout).
            now = datetime.now(timezone.utc)
            live = {p.name for p in pods if is_warm(p, now, tune.warmup_seconds)}
            try:
                return await query_prometheus(self.session(), tune.metrics.url, engine.meta.namespace,
                                              engine.meta.name, tune.interval_seconds, live,
                                              slo.time_to_first_token_millis if slo else None,
                                              slo.time_per_output_token_millis if slo else None,
                                              pins=self.settings.metrics_pins)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                if isinstance(exc, MetricsRejected):
                    telemetry.METRICS_REJECTED.labels(reason=exc.reason).inc()
                log.warning("Could not query Prometheus for InferenceEngine %s: %s", engine.meta.name, exc)
                return None
        return loop.sampler.window(tune.interval_seconds, slo.time_to_first_token_millis if slo else None,
                                   slo.time_per_output_token_millis if slo else None)

    async def _run(self, loop: EngineLoop) -> None:
        failures = 0
        next_reconcile = 0.0
        next_sample: float | None = None  # None: not sampling (autotune off, no pods, or an invalid spec)
        pods: list[Any] = []
        while True:
            now = time.monotonic()
            try:
                engine = loop.engine()
                sampling = engine.spec.autotune.enabled and bool(pods)
                next_sample = (next_sample or now) if sampling else None
                if next_sample is not None and now >= next_sample:
                    # Advance first: a sample that fails must not leave the next one due now (a hot loop), and its
                    # failure must not postpone the reconcile either (issue 13).
                    next_sample = now + max(1.0, min(5.0, engine.spec.autotune.interval_seconds / 6))
                    try:
                        await self._sample(loop, engine.spec, pods)
                    except Exception:  # noqa: BLE001 — one engine's sampling bug costs one sample
                        log.exception("Sampling the metrics of InferenceEngine %s/%s failed", *loop.key)
                if now >= next_reconcile or loop.wake.is_set():
                    loop.wake.clear()
                    loop.generation = engine.meta.generation
                    kv = await self._window(loop, engine, pods)
                    p, observed = await reconcile(self.api, engine, dict(loop.body.get("status") or {}),
                                                  self.settings, kv)
                    before = (loop.body.get("status") or {}).get("batching", {}).get("maxBatchSize")
                    loop.body = {**loop.body, "status": p.status}
                    loop.wrote_status = True
                    if p.status["batching"]["maxBatchSize"] != before:  # the old pods' numbers no longer apply
                        loop.sampler.reset()
                    pods = list(observed.pods)
                    next_reconcile = time.monotonic() + requeue_after(engine, p, self.resync_seconds).total_seconds()
                failures = 0
            except asyncio.CancelledError:
                raise
            except InvalidEngineError as exc:
                log.error("%s", exc)
                next_reconcile, next_sample = time.monotonic() + self.resync_seconds, None
            except (ApiError, aiohttp.ClientError) as exc:
                delay = ERROR_BACKOFF_SECONDS[min(failures, len(ERROR_BACKOFF_SECONDS) - 1)]
                failures += 1
                telemetry.RECONCILES.labels(result="error").inc()
                log.warning("Reconcile of InferenceEngine %s/%s failed (retry in %ss): %s", *loop.key, delay, exc)
                next_reconcile = time.monotonic() + delay
            except Exception:  # noqa: BLE001 — a bug in one engine's loop must not stop the others
                telemetry.RECONCILES.labels(result="error").inc()
                log.exception("Reconcile of InferenceEngine %s/%s crashed", *loop.key)
                next_reconcile = time.monotonic() + self.resync_seconds
            deadline = next_reconcile if next_sample is None else min(next_reconcile, next_sample)
            try:
                await asyncio.wait_for(loop.wake.wait(), timeout=max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                pass
