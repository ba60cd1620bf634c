"""The scheduler: one long-lived task per InferenceEngine that reconciles when woken or due, and samples the
engine's pod metrics in between.

Why not kopf daemons or timers: they require a finalizer on every object, so uninstalling the operator
before deleting the engines would leave them stuck in Terminating. kvpilot needs no cleanup of its own
(owner references let the garbage collector delete every child), so it runs finalizer-free: kopf's
event handlers feed the latest object into these loops (``EngineLoops.observe``) and wake them on spec changes.

The jobs around the scheduler live beside it: the child watches and whom a child's change wakes in
``k8s/watches.py``; where the tuner's signals come from (the pods, or Prometheus) in ``observe/signals.py``; one
pass in ``reconcile.py``, its writes in ``k8s/writes.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import aiohttp

from kvpilot import defaults, telemetry
from kvpilot.api.models import InferenceEngine
from kvpilot.api.status import EngineStatus, parse_status
from kvpilot.api.validate import InvalidEngineError
from kvpilot.desired.build import RETRY_ANNOTATION
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.plan import requeue_after
from kvpilot.desired.settings import Settings
from kvpilot.desired.storage import cache_claim_name
from kvpilot.k8s.api import Api
from kvpilot.k8s.errors import PERMANENT_ERRORS, ApiError
from kvpilot.k8s.watches import ChildWatches
from kvpilot.k8s.writes import ChildWriter
from kvpilot.logfilter import install as install_repeat_filter
from kvpilot.logjson import bind_engine
from kvpilot.observe.scrape import EngineSampler, sample_seconds
from kvpilot.observe.signals import MetricsSource
from kvpilot.planning import Planner
from kvpilot.reconcile import ApplyFailed, engine_from_body, reconcile
from kvpilot.workqueue import CHANGE, RESYNC, PrioritySlots

log = logging.getLogger(__name__)
ERROR_BACKOFF_SECONDS = (2, 5, 15, 30, 60)
# RBAC denials, rejected objects and names taken by foreign objects do not heal by retrying: wait longer (the
# status already says why). Such a back-off holds whatever else the loop does in between: metrics samples do not
# end it, nor do the children's watch events; only a change of the spec retries at once (issue 22).
PERMANENT_BACKOFF_SECONDS = (30, 120, 300, 600)


async def wait_for_wake(wake: asyncio.Event, timeout: float) -> None:
    """Until ``wake`` is set or ``timeout`` seconds have passed, whichever is first."""
    try:
        await asyncio.wait_for(wake.wait(), timeout=timeout)
    except TimeoutError:
        pass


def backoff_seconds(exc: BaseException, failures: int) -> int:
    """How long to wait before retrying after the ``failures``-th failure in a row (0-based)."""
    table = PERMANENT_BACKOFF_SECONDS if is_permanent(exc) else ERROR_BACKOFF_SECONDS
    return table[min(failures, len(table) - 1)]


def is_permanent(exc: BaseException) -> bool:
    """Whether the API server would answer the same again (a 4xx, a 500 naming an invalid object, a taken name)."""
    cause = exc.cause if isinstance(exc, ApplyFailed) else exc
    return isinstance(cause, PERMANENT_ERRORS)


@dataclass
class EngineLoop:
    """One engine's latest object, what its passes learnt, and its schedule."""

    key: tuple[str, str]
    body: dict[str, Any]  # the latest InferenceEngine as stored (JSON), without managedFields
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    generation: int = 0
    sampler: EngineSampler = field(default_factory=EngineSampler)
    parsed: tuple[str, InferenceEngine] | None = None  # ("uid/generation", its parse) of the last parse
    wrote_status: bool = False
    fingerprint: str = ""  # of the engine it wants (the last plan's): index entries wake only its users
    claim: str | None = None  # its cache claim: claim events wake only its users
    # (the stored status dict, its parse): status is parsed once per stored version, not once per reader
    typed_status: tuple[object, EngineStatus] | None = None
    pods: tuple[PodState, ...] = ()  # its serving pods, as the last pass observed them: what is sampled
    pod_limit: int | None = None  # the most serving pods it may run (replicas + surge): a window from more is void
    failures: int = 0  # passes failed in a row (the back-off); only a pass that succeeds resets it
    held: bool = False  # the last pass failed for good: only the back-off's end or a spec change retries
    spec_changed: bool = False  # the spec (or a request in its annotations) changed since the last pass
    next_reconcile: float = 0.0  # on the scheduler's clock
    next_sample: float | None = None  # None: not sampling (autotune off, no pods, or an invalid spec)

    def engine(self) -> InferenceEngine:
        """The typed engine of the latest body, parsed (and defaulted, validated) once per new version."""
        meta = self.body.get("metadata") or {}
        version = f"{meta.get('uid')}/{meta.get('generation')}/{requests_of(self.body)}"
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


def requests_of(body: dict[str, Any]) -> str | None:
    """What the engine asks of the operator outside its spec (annotations change no generation): a build retry."""
    return ((body.get("metadata") or {}).get("annotations") or {}).get(RETRY_ANNOTATION)


def pod_limit(engine: InferenceEngine, observed: Observed) -> int:
    """The most serving pods the engine runs at once: its replicas, plus the surge its Deployment allows, plus a
    canary retune's pod (autotune/canary.py)."""
    dep = observed.deployment
    surge = dep.rolling_update[0] if dep is not None and dep.rolling_update is not None else 0
    canary = observed.canary_deployment
    return engine.spec.serving.replicas + max(surge, 0) + (max(canary.replicas, canary.pods) if canary else 0)


def _runtime_batch(status: EngineStatus) -> int | None:
    """status.batching.maxBatchSize: the runtime limit the serving pods were given."""
    return status.batching.max_batch_size if status.batching is not None else None


class EngineLoops:
    """The registry of loops, fed by kopf events, and the scheduler that runs them."""

    def __init__(self, api: Api, settings: Settings, resync_seconds: float,
                 concurrent_reconciles: int = defaults.CONCURRENT_RECONCILES,
                 concurrent_scrapes: int = defaults.CONCURRENT_SCRAPES,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[asyncio.Event, float], Awaitable[None]] = wait_for_wake,
                 wall_clock: Callable[[], float] = time.time, writer: ChildWriter | None = None):
        """``writer`` is the operator's write layer over ``api`` (one per operator; by default a new one).
        ``clock`` and ``wait`` are the loops' time: tests run them on a virtual clock. ``wall_clock`` (seconds
        since the epoch) is the date the loops see: pod ages (warmup), sample times, and the ``now`` of each
        reconcile (condition timestamps, the tuner's cooldowns). Every reading of the date goes through it, so
        a test on a fake date gets the same decisions on any day."""
        self.api, self.settings, self.resync_seconds = api, settings, resync_seconds
        self.writer = writer or ChildWriter(api)
        self.clock, self.wait, self.wall_clock = clock, wait, wall_clock
        self.loops: dict[tuple[str, str], EngineLoop] = {}
        self.slots = PrioritySlots(concurrent_reconciles)
        self.watches = ChildWatches(api, self.loops)  # fills the cache; wakes the loops a child change concerns
        self.signals = MetricsSource(settings.metrics_pins, wall_clock, concurrent_scrapes)
        self.planner = Planner()  # the tuner's what-if runs in its worker thread, within a CPU budget per engine
        install_repeat_filter(("kvpilot.observe.scrape", "kvpilot.observe.signals", __name__))

    def now(self) -> datetime:
        """The wall clock as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall_clock(), timezone.utc)

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
        asked = requests_of(body) != requests_of(loop.body)
        loop.body = {**body, "status": loop.body["status"]} if loop.wrote_status else body
        generation = int(meta.get("generation") or 0)
        if generation != loop.generation or asked:  # spec changed; status-only changes (ours) do not wake
            loop.spec_changed = True
            loop.wake.set()

    async def stop_all(self) -> None:
        self.watches.stop()
        tasks = [loop.task for loop in self.loops.values() if loop.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.signals.close()
        self.planner.close()

    async def _run(self, loop: EngineLoop) -> None:
        bind_engine(namespace=loop.key[0], name=loop.key[1])  # this task's log lines name the engine
        await self.watches.synced.wait()  # never plan from a cache that has not been filled: it would re-create all
        while True:
            now = self.clock()
            try:
                await self._sample_if_due(loop, loop.engine(), now)
                if self._reconcile_due(loop, now):
                    await self._reconcile(loop)
                    loop.failures, loop.held = 0, False  # only a pass that succeeded ends a back-off
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 — a bug in one engine's loop must not stop the others
                self._failed(loop, exc)
            if loop.held and not loop.spec_changed:
                loop.wake.clear()  # a child's news waits for the back-off; the pass then reads it from the cache
            due = loop.next_reconcile if loop.next_sample is None else min(loop.next_reconcile, loop.next_sample)
            await self.wait(loop.wake, max(0.05, due - self.clock()))

    @staticmethod
    def _reconcile_due(loop: EngineLoop, now: float) -> bool:
        """A pass is due at its time, or when woken, unless a permanent failure holds it (then only a spec
        change is news enough)."""
        woken = loop.wake.is_set() and (not loop.held or loop.spec_changed)
        return now >= loop.next_reconcile or woken

    async def _sample_if_due(self, loop: EngineLoop, engine: InferenceEngine, now: float) -> None:
        sampling = engine.spec.autotune.enabled and bool(loop.pods)
        loop.next_sample = (loop.next_sample or now) if sampling else None
        if loop.next_sample is None or now < loop.next_sample:
            return
        # Advance first: a sample that fails must not leave the next one due now (a hot loop), and its failure
        # must not postpone the reconcile either (issue 13).
        loop.next_sample = now + sample_seconds(engine.spec.autotune.interval_seconds)
        try:
            await self.signals.sample(loop.sampler, engine.spec, loop.pods, loop.status())
        except Exception:  # noqa: BLE001 — one engine's sampling bug costs one sample
            log.exception("Sampling the metrics of InferenceEngine %s/%s failed", *loop.key)

    async def _reconcile(self, loop: EngineLoop) -> None:
        async with self.slots.hold(CHANGE if loop.wake.is_set() else RESYNC):
            loop.wake.clear()
            loop.spec_changed = False
            engine = loop.engine()  # the latest body: it may have changed while queued
            loop.generation = engine.meta.generation
            kv = await self.signals.window(loop.sampler, engine, loop.pods, loop.pod_limit)
            canary_kv = await self.signals.canary_windows(loop.sampler, engine, loop.pods)
            samples, prompts = loop.sampler.fresh()  # the engine fit takes each sample once (autotune/trust.py)
            # A canary pod runs another limit than the one the fit files its samples under (autotune/canary.py).
            canaries = {p.name for p in loop.pods if p.canary}
            samples = {pod: s for pod, s in samples.items() if pod not in canaries}
            prompts = {pod: w for pod, w in prompts.items() if pod not in canaries}
            self.planner.observe_pods(engine, samples, prompts, self.wall_clock(), _runtime_batch(loop.status()) or 0)
            raw = loop.body.get("status")
            p, observed = await reconcile(self.api, engine, dict(raw) if isinstance(raw, dict) else {},
                                          self.settings, kv, now=self.now(), planner=self.planner,
                                          typed=loop.status(), writer=self.writer, canary_kv=canary_kv)
        before = _runtime_batch(loop.status())  # the stored status (its parse is kept per version)
        if p.written is not None:
            loop.wrote(p.written, p.status)
        loop.fingerprint, loop.claim = p.fingerprint, cache_claim_name(engine.meta, engine.spec)
        if _runtime_batch(p.status) != before:  # the old pods' numbers no longer apply
            loop.sampler.reset()
        loop.pods = tuple(observed.pods)
        loop.pod_limit = pod_limit(engine, observed)
        bind_engine(fingerprint=p.fingerprint, decision=p.decision.action if p.decision else None)
        loop.next_reconcile = self.clock() + requeue_after(engine, p, self.resync_seconds).total_seconds()

    def _failed(self, loop: EngineLoop, exc: Exception) -> None:
        """A pass (or the parse before it) raised: when to try again, and what to log and count."""
        if isinstance(exc, InvalidEngineError):
            log.error("%s", exc)
            loop.next_reconcile, loop.next_sample = self.clock() + self.resync_seconds, None
        elif isinstance(exc, (ApiError, aiohttp.ClientError)):
            if isinstance(exc, ApplyFailed) and exc.status is not None and exc.typed is not None:
                loop.wrote(exc.status, exc.typed)  # written: keep it as ours
            delay = backoff_seconds(exc, loop.failures)
            loop.failures += 1
            loop.held = is_permanent(exc)
            telemetry.RECONCILES.labels(result="error").inc()
            log.warning("Reconcile of InferenceEngine %s/%s failed (retry in %ss): %s", *loop.key, delay, exc)
            loop.next_reconcile = self.clock() + delay
        else:
            telemetry.RECONCILES.labels(result="error").inc()
            log.exception("Reconcile of InferenceEngine %s/%s crashed", *loop.key)
            loop.next_reconcile = self.clock() + self.resync_seconds
