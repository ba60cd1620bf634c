"""The tuner's window from a Prometheus server (``autotune.metrics.source: Prometheus``).

Prometheus scrapes each serving pod's ``/prometheus/metrics`` (the chart's PodMonitor, which copies the pod
label serving.kvpilot.io/engine into ``engine`` and the operator's usual ``namespace`` and ``pod``). One range
query returns every raw sample of the engine's series over the tuning interval; each pod's scrapes are
turned back into exposition text and read by the same parser the Pod source uses, then summarized by the
same ``summarize``. So both sources compute their signals (KV peak, queue, latency percentiles, TTFT/TPOT
misses, completion rate) the same way, from the same metric names, with one sample per scrape instead of
one per engine iteration.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Collection
from typing import Any

import aiohttp

from kvpilot.api.metrics_url import MetricsPin, pinned_request, resolved_problem
from kvpilot.desired.observed import KvWindow
from kvpilot.observe.window import summarize
from kvpilot.trtllm.metrics import IterationSample, LatencySnapshot, parse_prometheus

TIMEOUT = aiohttp.ClientTimeout(total=10)
MIN_RANGE_SECONDS = 30  # at least a few scrapes at the PodMonitor's default 15s interval


def window_query(namespace: str, engine: str, range_seconds: int) -> str:
    """Every series of the engine's pods over the range (a range-vector selector: raw samples, no functions)."""
    sel = f'namespace="{_escape(namespace)}",engine="{_escape(engine)}",pod!=""'
    return f"{{{sel}}}[{range_seconds}s]"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _exposition(series: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> str:
    """One scrape's samples as Prometheus text, with TYPE lines for histograms (the parser needs them)."""
    names = {name for name, _ in series}
    histograms = {n[: -len("_bucket")] for n in names if n.endswith("_bucket")}
    lines: list[str] = []
    family = None
    for (name, labels), value in sorted(series.items(), key=lambda kv: (_family(kv[0][0], histograms), kv[0])):
        if _family(name, histograms) != family:  # a TYPE line opens its family, right before its samples
            family = _family(name, histograms)
            if family in histograms:
                lines.append(f"# TYPE {family} histogram")
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        lines.append(f"{name}{{{text}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _family(name: str, histograms: set[str]) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return name[: -len(suffix)]
    return name


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


TARGET_LABELS = {"__name__", "namespace", "engine", "pod", "container", "endpoint", "job", "instance", "service"}


def samples_from_matrix(
    result: list[dict[str, Any]], live_pods: Collection[str] | None = None
) -> tuple[dict[str, list[IterationSample]], dict[str, list[LatencySnapshot]]]:
    """A range query's matrix -> per pod, the iteration gauges and latency histograms of every scrape.

    ``live_pods``: when given, only these pods count (pods of an older configuration still have samples in
    the range after a rollout; the Pod source forgets them too)."""
    scrapes: dict[str, dict[float, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = defaultdict(
        lambda: defaultdict(dict))
    for item in result:
        metric = item.get("metric") or {}
        pod, name = metric.get("pod", ""), metric.get("__name__", "")
        if not pod or not name or (live_pods is not None and pod not in live_pods):
            continue
        labels = tuple(sorted((k, v) for k, v in metric.items() if k not in TARGET_LABELS))
        for stamp, value in item.get("values") or []:
            scrapes[pod][float(stamp)][(name, labels)] = float(value)
    samples: dict[str, list[IterationSample]] = {}
    latency: dict[str, list[LatencySnapshot]] = {}
    for pod, by_time in scrapes.items():
        for stamp in sorted(by_time):
            sample, snap = parse_prometheus(_exposition(by_time[stamp]), stamp)
            if sample is not None:
                samples.setdefault(pod, []).append(sample)
            latency.setdefault(pod, []).append(snap)
    return samples, latency


async def query_prometheus(
    session: aiohttp.ClientSession, url: str, namespace: str, engine: str, interval_seconds: int,
    live_pods: Collection[str] | None = None, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
    pins: Collection[MetricsPin] = (),
) -> KvWindow | None:
    """The tuner's window over the last interval (at least MIN_RANGE_SECONDS), None when Prometheus has no
    sample of the engine's KV gauges (e.g. TensorRT-LLM builds that do not export them: use ``source: Pod``)."""
    # Checked again here, not only at admission: a CRD installed before the rule, or a Service name that
    # resolves to the metadata address, must not turn the operator into an SSRF proxy. No redirects either.
    problem = await asyncio.to_thread(resolved_problem, url, pins=pins)
    if problem:
        raise ValueError(f"autotune.metrics.url {url[:200]!r} refused: {problem}")
    range_seconds = max(int(interval_seconds), MIN_RANGE_SECONDS)
    params = {"query": window_query(namespace, engine, range_seconds)}
    target, headers = pinned_request(f"{url.rstrip('/')}/api/v1/query", pins)
    async with session.get(target, params=params, headers=headers, timeout=TIMEOUT,
                           allow_redirects=False) as resp:
        body = await resp.json(content_type=None)
    if body.get("status") != "success":
        raise ValueError(f"Prometheus query failed: {body.get('errorType', '')} {body.get('error', body)}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ValueError(f"Prometheus answered a {data.get('resultType')!r}, not the matrix of a range selector")
    samples, latency = samples_from_matrix(data.get("result") or [], live_pods)
    return summarize(samples, latency, window_seconds=range_seconds, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
