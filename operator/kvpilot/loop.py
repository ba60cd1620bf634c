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
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import aiohttp

from kvpilot import telemetry
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import EngineStatus, parse_status
from kvpilot.api.validate import InvalidEngineError
from kvpilot.autotune.window import KvWindow
from kvpilot.k8s.cache import CHILD_KINDS, COMPONENT_LABEL, INDEX_COMPONENT, owners_of
from kvpilot.k8s.capacity import BOUND_POD_KIND, NODE_KIND
from kvpilot.k8s.informer import Informer
from kvpilot.desired.plan import requeue_after
from kvpilot.desired.settings import Settings
from kvpilot.desired.storage import cache_claim_name
from kvpilot.k8s.api import Api
from kvpilot.k8s.errors import ApiError, Forbidden, Invalid
from kvpilot.logfilter import install as install_repeat_filter
from kvpilot.logjson import bind_engine
from kvpilot.observe.prometheus import query_prometheus
from kvpilot.observe.scrape import EngineFacts, EngineSampler, is_warm, sample_seconds
from kvpilot.planning import Planner
from kvpilot.reconcile import ApplyFailed, engine_from_body, reconcile
from kvpilot.trtllm.metrics import MetricsRejected
from kvpilot.workqueue import CHANGE, RESYNC, PrioritySlots

log = logging.getLogger(__name__)
ERROR_BACKOFF_SECONDS = (2, 5, 15, 30, 60)
# RBAC denials and rejected objects do not heal by retrying: wait longer (the status already says why).
PERMANENT_BACKOFF_SECONDS = (30, 120, 300, 600)
DEFAULT_CONCURRENT_RECONCILES = 32
DEFAULT_CONCURRENT_SCRAPES = 64


async def wait_for_wake(wake: asyncio.Event, timeout: float) -> None:
    """Until ``wake`` is set or ``timeout`` seconds have passed, whichever is first."""
    try:
        await asyncio.wait_for(wake.wait(), timeout=timeout)
    except TimeoutError:
        pass


def backoff_seconds(exc: BaseException, failures: int) -> int:
    """How long to wait before retrying after the ``failures``-th failure in a row (0-based)."""
    cause = exc.cause if isinstance(exc, ApplyFailed) else exc
    table = PERMANENT_BACKOFF_SECONDS if isinstance(cause, (Forbidden, Invalid)) else ERROR_BACKOFF_SECONDS
    return table[min(failures, len(table) - 1)]


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
    fingerprint: str = ""  # of the engine it wants (the last plan's): index entries wake only its users
    claim: str | None = None  # its cache claim: claim events wake only its users
    # (the stored status dict, its parse): status is parsed once per stored version, not once per reader
    typed_status: tuple[object, EngineStatus] | None = None

    def engine(self) -> Any:
        """The typed engine of the latest body, parsed (and defaulted, validated) once per new version."""
        meta = self.body.get("metadata") or {}
        version = f"{meta.get('uid')}/{meta.get('generation')}"
        if self.parsed is None or self.parsed[0] != version:
            self.parsed = (version, engine_from_body(self.body, self.status()))
        return self.parsed[1]

    def status(self) -> EngineStatus:
        """The latest body's status, typed (user-writable: parse_status reads what does not fit as absent)."""
        raw = self.body.get("status")
        if self.typed_status is None or self.typed_status[0] is not raw:
            self.typed_status = (raw, parse_status(raw))
        return self.typed_status[1]

    def wrote(self, written: dict[str, Any], status: EngineStatus) -> None:
        """Keep the status this operator just wrote as the stored one (and its typed form, without a reparse)."""
        self.body, self.wrote_status = {**self.body, "status": written}, True
        self.typed_status = (written, status)


def _runtime_batch(status: EngineStatus) -> int | None:
    """status.batching.maxBatchSize: the runtime limit the serving pods were given."""
    return status.batching.max_batch_size if status.batching is not None else None


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


def _only_owners_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """A shared build Job gaining an owner (each engine of the fingerprint joins it) is news to nobody: the
    joining engine recorded it already, and waking the Job's ten owners for each join cost ~9,000 passes at
    1,000 engines. Its status or labels changing is news."""
    if old is None:
        return False
    meta_old, meta_new = old.get("metadata") or {}, new.get("metadata") or {}
    return (old.get("status") == new.get("status") and meta_old.get("labels") == meta_new.get("labels")
            and meta_old.get("annotations") == meta_new.get("annotations")
            and meta_old.get("deletionTimestamp") == meta_new.get("deletionTimestamp"))


class EngineLoops:
    """The registry of loops, fed by kopf events."""

    def __init__(self, api: Api, settings: Settings, resync_seconds: float,
                 concurrent_reconciles: int = DEFAULT_CONCURRENT_RECONCILES,
                 concurrent_scrapes: int = DEFAULT_CONCURRENT_SCRAPES,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[asyncio.Event, float], Awaitable[None]] = wait_for_wake,
                 wall_clock: Callable[[], float] = time.time):
        """``clock`` and ``wait`` are the loops' time: tests run them on a virtual clock. ``wall_clock`` (seconds
        since the epoch) is the date the loops see: pod ages (warmup), sample times, and the ``now`` of each
        reconcile (condition timestamps, the tuner's cooldowns). Every reading of the date goes through it, so
        a test on a fake date gets the same decisions on any day."""
        self.api = api
        self.clock = clock
        self.wall_clock = wall_clock
        self.wait = wait
        self.settings = settings
        self.resync_seconds = resync_seconds
        self.loops: dict[tuple[str, str], EngineLoop] = {}
        self._session: aiohttp.ClientSession | None = None
        self.slots = PrioritySlots(concurrent_reconciles)
        self.synced = asyncio.Event()  # every child kind listed once: the cache can answer
        self.synced.set()  # until informers are started (tests feed the cache by hand)
        self._informers: list[Informer] = []
        self._unsynced: set[tuple[str, str | None]] = set()
        self.scrape_slots = asyncio.Semaphore(concurrent_scrapes)
        self.planner = Planner()  # the tuner's what-if runs in its worker thread, within a CPU budget per engine
        install_repeat_filter(("kvpilot.observe.scrape", __name__))

    def now(self) -> datetime:
        """The wall clock as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall_clock(), timezone.utc)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Called for every watch event of an InferenceEngine."""
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
        body = {**body, "metadata": meta}  # kept per engine: managedFields are half of it and never read
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            loop = self.loops.pop(key, None)
            if loop and loop.task:
                loop.task.cancel()
            telemetry.forget(*key)
            self.planner.forget(key)
            return
        loop = self.loops.get(key)
        if loop is None:
            loop = self.loops[key] = EngineLoop(key=key, body=body, sampler=EngineSampler(clock=self.wall_clock))
            loop.wake.set()  # a new engine is a pending change: it goes before the resyncs of the others
            loop.task = asyncio.create_task(self._run(loop), name=f"kvpilot:{key[0]}/{key[1]}")
            return
        # The operator is the only writer of status, so once it has written one, a watch event can only carry
        # that status or an older one (events lag): keep ours rather than roll the tuner's bookkeeping back.
        loop.body = {**body, "status": loop.body["status"]} if loop.wrote_status else body
        generation = int(meta.get("generation") or 0)
        if generation != loop.generation:  # spec changed; status-only changes (ours) do not wake
            loop.wake.set()

    def wake_owners(self, child: dict[str, Any]) -> None:
        """A child changed: wake the InferenceEngines it concerns (its owners; a shared build Job has several,
        which all need its outcome). The caller wakes only on a change the cache saw, not on bookkeeping."""
        meta = child.get("metadata") or {}
        for name in owners_of(child):
            loop = self.loops.get((meta.get("namespace", ""), name))
            if loop:
                loop.wake.set()

    def start_informers(self, namespaces: list[str]) -> None:
        """List and watch every child kind (in each namespace, or cluster-wide) into the cache."""
        loop = asyncio.get_running_loop()
        self.synced.clear()
        scopes: list[str | None] = [*namespaces] or [None]  # None: cluster-wide
        for kind in CHILD_KINDS:
            for ns in scopes:
                self._unsynced.add((kind.kind, ns))

                def on_list(kind_name: str, items: list[dict[str, Any]], ns: str | None = ns) -> None:
                    self.children_listed(kind_name, items, ns)

                inf = Informer(self.api.api_client, kind, ns, loop, on_list, self.child_event)
                self._informers.append(inf)
                inf.start()

    def start_gpu_informers(self) -> None:
        """Watch Nodes and the pods of every namespace into ``api.gpus``: whether a surge pod finds a free GPU
        (``serving.rollout.strategy: Auto``). Not part of ``synced``: until listed, Auto does not surge; a
        denied watch (RBAC without nodes/pods at cluster scope) retries with back-off and Auto stays NoSurge."""
        loop = asyncio.get_running_loop()
        for kind in (NODE_KIND, BOUND_POD_KIND):
            inf = Informer(self.api.api_client, kind, None, loop, self.api.gpus.listed, self._gpu_event)
            self._informers.append(inf)
            inf.start()

    def _gpu_event(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        self.api.gpus.event(kind, event_type, body)

    def children_listed(self, kind: str, items: list[dict[str, Any]], namespace: str | None) -> None:
        for body in self.api.cache.replace(kind, items, namespace):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))
        self._unsynced.discard((kind, namespace))
        if not self._unsynced and not self.synced.is_set():
            log.info("Watch cache filled: %s", {k.kind: self.api.cache.count(k.kind) for k in CHILD_KINDS})
            self.synced.set()

    def child_event(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.child_deleted(kind, body)
        else:
            self.child_changed(kind, body)

    def child_changed(self, kind: str, body: dict[str, Any]) -> None:
        """A watch listed or changed a child: cache it, and wake whom it concerns if it really changed."""
        old = self.api.cache.get(kind, (body.get("metadata") or {}).get("namespace", ""),
                                 (body.get("metadata") or {}).get("name", ""))
        if self.api.cache.upsert(kind, body) and not (kind == "Job" and _only_owners_changed(old, body)):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))

    def child_deleted(self, kind: str, body: dict[str, Any]) -> None:
        """A child is gone (by hand, or by the garbage collector): the next pass of its owner restores it."""
        if self.api.cache.delete(kind, body):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))

    def _wake_for(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if kind == "PersistentVolumeClaim":
            self.wake_claim_users(meta.get("namespace", ""), meta.get("name", ""))
        elif kind == "ConfigMap" and labels.get(COMPONENT_LABEL) == INDEX_COMPONENT:
            self.wake_claim_users(meta.get("namespace", ""), (body.get("data") or {}).get("claim", ""),
                                  (body.get("data") or {}).get("fingerprint", ""))
        else:
            self.wake_owners(body)

    def wake_claim_users(self, namespace: str, claim: str, fingerprint: str | None = None) -> None:
        """A cache claim or an engine-index entry changed: wake the engines of that namespace that use the
        claim (and, for an entry, want that engine); an engine not yet reconciled is woken anyway."""
        for (ns, _name), loop in self.loops.items():
            if ns != namespace or (loop.claim is not None and loop.claim != claim):
                continue
            if fingerprint is None or not loop.fingerprint or loop.fingerprint == fingerprint:
                loop.wake.set()

    async def stop_all(self) -> None:
        for inf in self._informers:
            inf.stop()
        tasks = [loop.task for loop in self.loops.values() if loop.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        self.planner.close()

    async def _sample(self, loop: EngineLoop, spec: Any, pods: list[Any]) -> None:
        tune = spec.autotune
        if tune.metrics.source == "Prometheus" and tune.metrics.url:
            return  # the server keeps the history; queried once per reconcile
        await loop.sampler.tick(
            self.session(), pods, port=spec.serving.port, now=self.now(),
            warmup_seconds=tune.warmup_seconds, want_latency=True, facts=EngineFacts.from_status(loop.status()),
        )

    async def _window(self, loop: EngineLoop, engine: Any, pods: list[Any]) -> Any:
        tune = engine.spec.autotune
        if not tune.enabled:
            return None
        slo = tune.slo
        if tune.metrics.source == "Prometheus" and tune.metrics.url:
            # Only the warm pods of today's configuration count, as for the Pod source (Prometheus still has
            # the old pods' samples for a while after a rollout).
            now = self.now()
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
        window = loop.sampler.window(tune.interval_seconds, slo.time_to_first_token_millis if slo else None,
                                     slo.time_per_output_token_millis if slo else None)
        return engine_time(window, engine.spec)

    async def _run(self, loop: EngineLoop) -> None:
        failures = 0
        next_reconcile = 0.0
        next_sample: float | None = None  # None: not sampling (autotune off, no pods, or an invalid spec)
        pods: list[Any] = []
        bind_engine(namespace=loop.key[0], name=loop.key[1])  # this task's log lines name the engine
        await self.synced.wait()  # never plan from a cache that has not been filled: it would re-create all
        while True:
            now = self.clock()
            try:
                engine = loop.engine()
                sampling = engine.spec.autotune.enabled and bool(pods)
                next_sample = (next_sample or now) if sampling else None
                if next_sample is not None and now >= next_sample:
                    # Advance first: a sample that fails must not leave the next one due now (a hot loop), and its
                    # failure must not postpone the reconcile either (issue 13).
                    next_sample = now + sample_seconds(engine.spec.autotune.interval_seconds)
                    try:
                        async with self.scrape_slots:  # 1,000 pods sampled concurrently, but not all at once
                            await self._sample(loop, engine.spec, pods)
                    except Exception:  # noqa: BLE001 — one engine's sampling bug costs one sample
                        log.exception("Sampling the metrics of InferenceEngine %s/%s failed", *loop.key)
                if now >= next_reconcile or loop.wake.is_set():
                    async with self.slots.hold(CHANGE if loop.wake.is_set() else RESYNC):
                        loop.wake.clear()
                        engine = loop.engine()  # the latest body: it may have changed while queued
                        loop.generation = engine.meta.generation
                        kv = await self._window(loop, engine, pods)
                        raw = loop.body.get("status")
                        p, observed = await reconcile(self.api, engine, dict(raw) if isinstance(raw, dict) else {},
                                                      self.settings, kv, now=self.now(), planner=self.planner,
                                                      typed=loop.status())
                    before = _runtime_batch(loop.status())  # the stored status (its parse is kept per version)
                    if p.written is not None:
                        loop.wrote(p.written, p.status)
                    loop.fingerprint, loop.claim = p.fingerprint, cache_claim_name(engine.meta, engine.spec)
                    if _runtime_batch(p.status) != before:  # the old pods' numbers no longer apply
                        loop.sampler.reset()
                    pods = list(observed.pods)
                    bind_engine(fingerprint=p.fingerprint, decision=p.decision.action if p.decision else None)
                    next_reconcile = self.clock() + requeue_after(engine, p, self.resync_seconds).total_seconds()
                failures = 0
            except asyncio.CancelledError:
                raise
            except InvalidEngineError as exc:
                log.error("%s", exc)
                next_reconcile, next_sample = self.clock() + self.resync_seconds, None
            except (ApiError, aiohttp.ClientError) as exc:
                if isinstance(exc, ApplyFailed) and exc.status is not None and exc.typed is not None:
                    loop.wrote(exc.status, exc.typed)  # written: keep it as ours
                delay = backoff_seconds(exc, failures)
                failures += 1
                telemetry.RECONCILES.labels(result="error").inc()
                log.warning("Reconcile of InferenceEngine %s/%s failed (retry in %ss): %s", *loop.key, delay, exc)
                next_reconcile = self.clock() + delay
            except Exception:  # noqa: BLE001 — a bug in one engine's loop must not stop the others
                telemetry.RECONCILES.labels(result="error").inc()
                log.exception("Reconcile of InferenceEngine %s/%s crashed", *loop.key)
                next_reconcile = self.clock() + self.resync_seconds
            deadline = next_reconcile if next_sample is None else min(next_reconcile, next_sample)
            await self.wait(loop.wake, max(0.05, deadline - self.clock()))
