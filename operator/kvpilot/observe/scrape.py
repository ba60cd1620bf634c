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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import datetime

import aiohttp

from kvpilot import telemetry
from kvpilot.api.status import EngineInfo, EngineStatus
from kvpilot.api.timestamps import parse_rfc3339
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import PodState
from kvpilot.autotune.burst import BURST_HISTORY_SECONDS, equal_periods, fleet_arrivals
from kvpilot.autotune.calibrate import PromptWork
from kvpilot.autotune.summarize import summarize
from kvpilot.observe.replies import POD_REPLY_BYTES, ParsedReply, parse_replies, read_bounded
from kvpilot.observe.replies import decode_json as decode_json  # re-exported: its home before observe/replies.py
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, MetricsRejected

log = logging.getLogger(__name__)
TIMEOUT = aiohttp.ClientTimeout(total=5)
# The samples a pod's record holds (about 400 bytes each). A long interval (up to 3600 s) read every 5 s can bring
# up to 1000 iterations a read: past the cap the window keeps the newest samples.
MAX_SAMPLES_PER_POD = 20_000
MAX_REJECTIONS_KEPT = 256
# A pod that cannot be read (not listening yet, a fake pod, a network fault), or whose reply is refused (too big,
# not trtllm-serve's), is retried after 5 s, then 10, 20, ... up to 5 minutes: on a large fleet, failed scrapes
# every 5 s were most of the idle operator's CPU (docs/scale.md), and a hostile reply parsed every second was 17%
# of a core (issue 22). A reply that is read and kept resets it. Its warning is logged on the first failure, then
# at most once per WARN_EVERY_SECONDS with the count of failures since.
BACKOFF_BASE_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 300.0
WARN_EVERY_SECONDS = 300.0


def sample_seconds(interval_seconds: float) -> float:
    """The sampling period for a tuning interval: six samples per interval, between 1 and 5 seconds."""
    return max(1.0, min(5.0, interval_seconds / 6))


def _positive_int(value: int | None) -> int:
    """``value`` when it is positive (status is user-writable: a negative size is nonsense), else 0 (unknown)."""
    return value if value is not None and value > 0 else 0


@dataclass(frozen=True)
class EngineFacts:
    """What the served engine is, from status.engine: samples that contradict it come from another engine (a
    foreign pod wearing the engine's labels, or a stale one) and are ignored."""

    tokens_per_block: int = 0  # 0: unknown
    max_batch_size_ceiling: int = 0  # the engine's build-time max_batch_size; 0: unknown

    @classmethod
    def from_status(cls, status: EngineStatus) -> EngineFacts:
        engine = status.engine or EngineInfo()
        return cls(tokens_per_block=_positive_int(engine.tokens_per_block),
                   max_batch_size_ceiling=_positive_int(engine.max_batch_size))

    def inconsistency(self, s: IterationSample) -> str | None:
        """Why the sample cannot describe this engine, None when it can."""
        if s.used_blocks > s.max_blocks:
            return f"usedNumBlocks {s.used_blocks} > maxNumBlocks {s.max_blocks}"
        if self.tokens_per_block and s.tokens_per_block and s.tokens_per_block != self.tokens_per_block:
            return f"tokensPerBlock {s.tokens_per_block} is not the engine's {self.tokens_per_block}"
        # maxBatchSizeStatic is the executor's configured (runtime) limit, which never exceeds the engine's
        # ceiling (1.2 clamps it); above it, the sample comes from a bigger engine. PyTorch reports 0.
        if self.max_batch_size_ceiling and s.max_batch_size_static > self.max_batch_size_ceiling:
            return (f"maxBatchSizeStatic {s.max_batch_size_static} is above the engine's max_batch_size "
                    f"{self.max_batch_size_ceiling}")
        return None


def _age_seconds(pod: PodState, now: datetime) -> float:
    if not pod.started_at:
        return 0.0
    started = parse_rfc3339(pod.started_at, now.tzinfo)
    return (now - started).total_seconds()


def backoff_seconds(failures: int) -> float:
    """The wait after the ``failures``-th consecutive failed scrape of a pod: doubling, bounded."""
    if failures < 1:
        return 0.0
    return min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(failures - 1, 32))


@dataclass
class PodBackoff:
    """A pod's consecutive scrape failures: when it may be tried again, and when it was last warned about."""

    failures: int = 0
    retry_at: float = 0.0
    warned_at: float | None = None
    unwarned: int = 0  # failures since the last warning


def is_warm(pod: PodState, now: datetime, warmup_seconds: int) -> bool:
    """A pod whose numbers describe the configuration: ready, reachable, not leaving, past its warmup."""
    return bool(pod.ready and pod.ip and not pod.deleting and _age_seconds(pod, now) >= warmup_seconds)


@dataclass
class PodRecord:
    """What the sampler keeps of one serving pod: one object, dropped whole when the pod leaves the engine."""

    # The window: what the pod said under the configuration it runs (the newest MAX_SAMPLES_PER_POD). reset()
    # forgets it.
    samples: deque[IterationSample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES_PER_POD))
    latency: deque[tuple[float, LatencySnapshot]] = field(default_factory=deque)  # (wall time read, snapshot)
    # The arrival count (autotune/burst.py), kept across reset(): the traffic does not depend on the configuration
    # the pods run. Requests in the pod (active + queued) at its last kept sample; requests the iteration stats
    # said finished, summed since the pod was first read (the finished count of a pod without the request counter:
    # 1.2's TensorRT backend serves no Prometheus page); whether its last count came from that counter (a switch
    # is no count: the two start from different origins); and the (finished, in pod) it gave in this tick.
    in_pod: float = 0.0
    iter_done: float = 0.0
    counter_source: bool | None = None  # None: not counted yet
    reading: tuple[float, float] | None = None
    # Its consecutive scrape failures, kept across reset(): a new configuration does not make a pod reachable.
    backoff: PodBackoff | None = None
    # The tuner's engine fit (autotune/calibrate.py) takes each sample once: when it last took this pod's, and the
    # pod's (prompt tokens, finished requests) counters then (the prompts a PyTorch pod computed in between).
    fed_at: float = 0.0
    fed_counters: tuple[float, float] | None = None

    def forget_window(self) -> None:
        self.samples.clear()
        self.latency.clear()

    def prune(self, horizon: float) -> None:
        """Drop what was read before ``horizon`` (wall time)."""
        while self.samples and self.samples[0].timestamp_s < horizon:
            self.samples.popleft()
        while self.latency and self.latency[0][0] < horizon:
            self.latency.popleft()


@dataclass
class EngineSampler:
    """The samples of one engine's pods, kept for one tuning interval, and its arrivals for a longer history."""

    pods: dict[str, PodRecord] = field(default_factory=dict)
    # (wall time, pod, reason, message) of rejected payloads and ignored samples, for the condition message.
    rejections: deque[tuple[float, str, str, str]] = field(default_factory=lambda: deque(maxlen=MAX_REJECTIONS_KEPT))
    clock: Callable[[], float] = time.time  # injected in tests
    # The fleet's arrivals per sample, for the burstiness estimate (autotune/burst.py): (wall time, seconds since
    # the previous sample, arrivals or None where they could not be counted), kept BURST_HISTORY_SECONDS. Not
    # cleared by reset(): the traffic does not depend on the configuration the pods run, and a pod that comes or
    # goes breaks the chain of counts by itself (fleet_arrivals).
    arrivals: deque[tuple[float, float, float | None]] = field(default_factory=deque)
    # The fleet's readings at the previous tick, by pod, and when: fleet_arrivals compares the fleet as a whole,
    # so a pod that has left since must still be in it (its absence now breaks the count).
    _last_readings: dict[str, tuple[float, float]] = field(default_factory=dict)
    _counted_at: float | None = None

    def reset(self) -> None:
        """Forget what describes the configuration (after a rollout, old pods' numbers describe another one):
        every pod's window, and the rejections. The arrival history and its counts, and the pods' scrape
        back-off, survive: neither depends on the configuration."""
        for record in self.pods.values():
            record.forget_window()
        self.rejections.clear()

    def record(self, pod: str) -> PodRecord:
        """The pod's record, made on first use."""
        found = self.pods.get(pod)
        if found is None:
            found = self.pods[pod] = PodRecord()
        return found

    def reject(self, wall: float, pod: str, reason: str, message: str, count: int = 1) -> None:
        """Count rejected payloads or ignored samples (operator metric), keep them for the condition, log once."""
        telemetry.METRICS_REJECTED.labels(reason=reason).inc(count)
        for _ in range(min(count, MAX_REJECTIONS_KEPT)):
            self.rejections.append((wall, pod, reason, message))
        log.warning("Rejected %d metrics sample(s) from Pod %s (%s): %s", count, pod, reason, message)

    def _prune(self, horizon: float) -> None:
        for record in self.pods.values():
            record.prune(horizon)
        while self.rejections and self.rejections[0][0] < horizon:
            self.rejections.popleft()

    async def tick(
        self, session: aiohttp.ClientSession, pods: list[PodState], *, port: int, now: datetime,
        warmup_seconds: int, want_latency: bool, facts: EngineFacts | None = None,
    ) -> None:
        """Scrape every warm pod once. Never raises for what a pod sends: see ``accept``."""
        live = {p.name for p in pods}
        for gone in set(self.pods) - live:
            del self.pods[gone]
        wall = self.clock()
        warm = [p for p in pods if is_warm(p, now, warmup_seconds) and self._due(p.name, wall)]
        # Concurrently: one unreachable pod must not hold up the others (or the engine's reconcile).
        await asyncio.gather(*(self._scrape(session, pod, port, wall, want_latency, facts or EngineFacts())
                               for pod in warm))
        self.count_arrivals(wall, {p.name for p in warm})

    def count_arrivals(self, wall: float, scraped: set[str]) -> None:
        """Append the fleet's arrivals since the previous tick (None when they cannot be counted: a pod came,
        went or failed to answer, or a counter went back) to the burstiness history."""
        fresh = {pod: r.reading for pod, r in self.pods.items() if r.reading is not None}
        for record in self.pods.values():
            record.reading = None
        before, before_at = self._last_readings, self._counted_at
        self._last_readings, self._counted_at = fresh, wall
        if before_at is not None and wall > before_at:
            self.arrivals.append((wall, wall - before_at, fleet_arrivals(before, fresh, scraped)))
        while self.arrivals and self.arrivals[0][0] < wall - BURST_HISTORY_SECONDS:
            self.arrivals.popleft()

    async def _scrape(
        self, session: aiohttp.ClientSession, pod: PodState, port: int, wall: float, want_latency: bool,
        facts: EngineFacts,
    ) -> None:
        base = f"http://{pod.ip}:{port}"
        try:
            async with session.get(f"{base}/metrics", timeout=TIMEOUT) as resp:
                stats = await read_bounded(resp, POD_REPLY_BYTES) if resp.status == 200 else None
            prom = None
            if want_latency and stats is not None:
                async with session.get(f"{base}/prometheus/metrics", timeout=TIMEOUT) as resp:
                    # 404: no page (1.2's TensorRT backend without return_perf_metrics): not latency data.
                    prom = await read_bounded(resp, POD_REPLY_BYTES) if resp.status == 200 else None
        except MetricsRejected as exc:  # counted as a rejection, and backed off: the pod would send it again
            self.reject(wall, pod.name, exc.reason, str(exc))
            self._failed(pod.name, wall, f"reply refused: {exc}", warn=False)
            return
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._failed(pod.name, wall, f"could not scrape: {exc}")
            return
        if stats is None:
            self._failed(pod.name, wall, "/metrics answered with an error status")
            return
        # Parsed in a worker thread: a reply of up to POD_REPLY_BYTES costs tens of milliseconds of CPU, which on
        # the event loop would hold every other engine's pass and the API watches meanwhile.
        parsed = await asyncio.to_thread(parse_replies, stats, prom, wall)
        self.keep(pod.name, wall, parsed, facts)
        if parsed.rejected is not None:
            self._failed(pod.name, wall, f"reply refused: {parsed.rejected}", warn=False)
        else:
            self._answered(pod.name)

    def _due(self, pod: str, wall: float) -> bool:
        record = self.pods.get(pod)
        return record is None or record.backoff is None or wall >= record.backoff.retry_at

    def _answered(self, pod: str) -> None:
        """The pod answered: its back-off ends."""
        record = self.pods.get(pod)
        if record is not None:
            record.backoff = None

    def _failed(self, pod: str, wall: float, why: str, warn: bool = True) -> None:
        """Back the pod off; warn on its first failure and then at most once per WARN_EVERY_SECONDS (``warn``
        False: the caller logged it already, as a rejection)."""
        record = self.record(pod)
        state = record.backoff = record.backoff or PodBackoff()
        state.failures += 1
        state.unwarned += 1
        delay = backoff_seconds(state.failures)
        state.retry_at = wall + delay
        if warn and (state.warned_at is None or wall - state.warned_at >= WARN_EVERY_SECONDS):
            log.warning("Metrics of Pod %s: %s (%d failure(s) in a row, %d since the last warning; next try "
                        "in %.0fs)", pod, why, state.failures, state.unwarned, delay)
            state.warned_at, state.unwarned = wall, 0

    def accept(self, pod: str, wall: float, stats: bytes, prom: bytes | None, facts: EngineFacts) -> int:
        """Parse one pod's replies into the window; returns how many samples were kept.

        The parse and sample path for untrusted bytes: a malformed payload is one rejected sample, a sample
        inconsistent with the engine is ignored, both counted; nothing here raises (issue 13: one odd reply
        used to stop the engine's reconciles)."""
        return self.keep(pod, wall, parse_replies(stats, prom, wall), facts)

    def keep(self, pod: str, wall: float, parsed: ParsedReply, facts: EngineFacts) -> int:
        """Put what ``parse_replies`` read of one pod into its record (on the event loop: records are not shared
        with the parsing thread); returns how many samples were kept."""
        if parsed.rejected is not None:
            self.reject(wall, pod, parsed.rejected.reason, str(parsed.rejected))
            return 0
        snap = parsed.snap
        kept, ignored = [], []
        for sample in parsed.samples:
            why = facts.inconsistency(sample)
            if why is None:
                kept.append(sample)
            else:
                ignored.append(why)
        if ignored:
            self.reject(wall, pod, "inconsistent", ignored[-1], count=len(ignored))
        record = self.record(pod)
        record.samples.extend(kept)
        if kept:
            record.in_pod = float(kept[-1].active_requests + kept[-1].queued_requests)
        record.iter_done += sum(s.completed_requests for s in kept)
        counted = snap is not None and snap.completed is not None
        if record.counter_source is None or record.counter_source == counted:
            done = snap.completed if snap is not None and snap.completed is not None else record.iter_done
            record.reading = (done, record.in_pod)
        record.counter_source = counted
        if snap is not None:
            record.latency.append((wall, snap))
        return len(kept)

    def fresh(self) -> tuple[dict[str, list[IterationSample]], dict[str, PromptWork]]:
        """The samples each pod sent since the previous call, and the prompts its request counters grew by,
        for the tuner's engine fit (each sample once, whatever the passes that read the window)."""
        samples: dict[str, list[IterationSample]] = {}
        prompts: dict[str, PromptWork] = {}
        for pod, record in self.pods.items():
            new = [x for x in record.samples if x.timestamp_s > record.fed_at]
            if new:
                samples[pod] = new
                record.fed_at = new[-1].timestamp_s
            counters = next(((snap.prompt_tokens, snap.completed) for _at, snap in reversed(record.latency)
                             if snap.prompt_tokens is not None and snap.completed is not None), None)
            if counters is not None and record.fed_counters is not None:
                tokens, done = counters[0] - record.fed_counters[0], counters[1] - record.fed_counters[1]
                if tokens >= 0 and done >= 0:  # a counter that went back is a restarted pod: no figure
                    prompts[pod] = PromptWork(tokens, done)
            record.fed_counters = counters if counters is not None else record.fed_counters
        return samples, prompts

    def window(
        self, interval_seconds: float, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
        only: Collection[str] | None = None,
    ) -> KvWindow | None:
        """The last ``interval_seconds`` of every pod's samples, or of the pods named in ``only`` (a canary pod, or
        the pods beside it: autotune/canary.py); a group's window carries no rejection note (the whole one does)."""
        self._prune(self.clock() - interval_seconds)
        pods = {p: r for p, r in self.pods.items() if only is None or p in only}
        window = summarize(
            {p: list(r.samples) for p, r in pods.items()},
            {p: [snap for _at, snap in r.latency] for p, r in pods.items()},
            window_seconds=interval_seconds,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            arrival_counts=equal_periods([(period, count) for _, period, count in self.arrivals]),
        )
        if not self.rejections or only is not None:
            return window
        _, pod, reason, message = self.rejections[-1]
        note = f"Pod {pod}: {reason}: {message}"[:300]
        if window is None:  # nothing usable: an empty window the tuner holds on, carrying the note
            window = KvWindow(samples=0, pods=0, peak_utilization=0.0, mean_utilization=0.0, peak_used_blocks=0,
                              max_blocks=0, tokens_per_block=0, peak_active=0, mean_active=0.0, peak_queued=0,
                              mean_queued=0.0, paused=0, runtime_batch_size=0)
        return replace(window, rejected_samples=len(self.rejections), rejection=note)

