"""The operator's own Prometheus metrics (prometheus-client), served by ``kvpilot run --metrics-port``.

Names are part of the Helm chart's contract (dashboard, ServiceMonitor); change them with the chart.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from kvpilot.api.timestamps import parse_rfc3339

if TYPE_CHECKING:
    from kvpilot.api.models import InferenceEngine
    from kvpilot.desired.observed import JobState, Observed
    from kvpilot.desired.plan import Plan

RECONCILES = Counter("kvpilot_reconcile_total", "Reconcile passes by result.", ["result"])
RECONCILE_SECONDS = Histogram("kvpilot_reconcile_duration_seconds", "Duration of one reconcile pass.")
BUILDS = Counter("kvpilot_engine_builds_total", "Engine builds by outcome.", ["outcome"])
BUILD_SECONDS = Histogram(
    "kvpilot_engine_build_duration_seconds", "Engine build Job durations.",
    buckets=(60, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
ROLLOUTS = Counter("kvpilot_rollouts_total", "Serving rollouts started, by reason.", ["reason"])
BATCH_SIZE = Gauge("kvpilot_batch_size", "Runtime max_batch_size and engine ceiling.", ["namespace", "name", "kind"])
KV_UTILIZATION = Gauge("kvpilot_kv_cache_utilization_ratio", "Peak KV-cache pool utilization of the last window.",
                       ["namespace", "name"])
DECISIONS = Counter("kvpilot_autotune_decisions_total", "Autotune decisions.",
                    ["namespace", "name", "action", "reason"])
METRICS_REJECTED = Counter(
    "kvpilot_metrics_samples_rejected_total",
    "Serving-pod metrics payloads rejected as malformed, or samples ignored as inconsistent with the engine.",
    ["reason"],
)
WHAT_IF_CPU_SECONDS = Histogram(
    "kvpilot_autotune_whatif_cpu_seconds", "CPU seconds of one autotune pass that may run the what-if simulation "
    "(off the event loop; kvpilot/planning.py).", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
CANARIES = Counter("kvpilot_autotune_canaries_total", "Canary retunes (one pod at the new max_batch_size beside the "
                   "others: autotune/canary.py) by outcome: started, promoted, rolled_back, abandoned.", ["outcome"])
CANARY_OUTCOMES = {"CanaryStarted": "started", "CanaryPromoted": "promoted", "CanaryRolledBack": "rolled_back",
                   "CanaryAbandoned": "abandoned"}
RECOMMENDED = Gauge("kvpilot_autotune_recommended_batch_size", "The tuner's recommended runtime max_batch_size.",
                    ["namespace", "name"])


def _parse(ts: str | None) -> datetime | None:
    return parse_rfc3339(ts) if ts else None


def record_build_finished(manifest: dict[str, Any], job: JobState | None) -> None:
    """Called once per engine that records a finished build (a shared build counts for each of its owners)."""
    BUILDS.labels(outcome="succeeded").inc()
    if job is not None:
        start, end = _parse(job.start_time), _parse(job.completion_time)
        if start and end:
            BUILD_SECONDS.observe((end - start).total_seconds())


def record_plan(engine: InferenceEngine, p: Plan, observed: Observed, seconds: float) -> None:
    ns, name = engine.meta.namespace, engine.meta.name
    RECONCILES.labels(result="ok").inc()
    RECONCILE_SECONDS.observe(seconds)
    runtime = p.status.batching.max_batch_size if p.status.batching is not None else None
    BATCH_SIZE.labels(ns, name, "runtime").set(runtime or 0)
    ceiling = p.status.engine.max_batch_size if p.status.engine is not None else None
    if ceiling:
        BATCH_SIZE.labels(ns, name, "ceiling").set(ceiling)
    if observed.kv is not None:
        KV_UTILIZATION.labels(ns, name).set(observed.kv.peak_utilization)
    for event in p.events:
        if event.reason == "EngineCacheHit":
            BUILDS.labels(outcome="cache_hit").inc()
        if event.reason == "EngineBuildFailed":
            BUILDS.labels(outcome="failed").inc()
        if event.reason in ("RolloutStarted", "BatchSizeChanged"):
            ROLLOUTS.labels(reason=event.reason).inc()
        if event.reason in CANARY_OUTCOMES:
            CANARIES.labels(outcome=CANARY_OUTCOMES[event.reason]).inc()
    if p.decision is not None:
        DECISIONS.labels(ns, name, p.decision.action.lower(), p.decision.reason).inc()
        RECOMMENDED.labels(ns, name).set(p.decision.ceiling_request or p.decision.target)


def forget(namespace: str, name: str) -> None:
    """Drop the per-engine series of a deleted InferenceEngine."""
    for gauge, labels in ((BATCH_SIZE, ("runtime", "ceiling")), (KV_UTILIZATION, (None,)), (RECOMMENDED, (None,))):
        for extra in labels:
            try:
                gauge.remove(namespace, name, *([extra] if extra else []))
            except KeyError:
                pass
    for series in list(DECISIONS._metrics):  # the per-engine series of the decisions counter
        if series[:2] == (namespace, name):
            DECISIONS.remove(*series)

# Scale: what the operator asks of the API server, and what its watch cache holds (issue 12).
API_REQUESTS = Counter("kvpilot_api_requests_total", "API-server requests the operator made, by verb and resource.",
                       ["verb", "resource"])
APPLIES_SKIPPED = Counter("kvpilot_applies_skipped_total",
                          "Applies skipped because the cached child already holds what kvpilot owns.", ["kind"])
CACHED_OBJECTS = Gauge("kvpilot_cached_objects", "Children held in the operator's watch cache, by kind.", ["kind"])
