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
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.summarize import summarize
from kvpilot.observe.replies import decode_json, read_bounded
from kvpilot.trtllm.metrics import (MAX_COUNT, MAX_PROMETHEUS_SAMPLES, IterationSample, LatencySnapshot,
                                    MetricsRejected, parse_prometheus)

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


MAX_SERIES = 10_000


def parse_matrix(body: Any) -> list[dict[str, Any]]:
    """A range query's answer, parsed as untrusted input: the matrix's series, each ``{"metric": {str: str},
    "values": [(float, float), ...]}`` with finite numbers, or ``MetricsRejected`` naming what is wrong (a
    proxy's error page, a top-level list, a null value) — never a KeyError or TypeError further down."""
    if not isinstance(body, dict):
        raise MetricsRejected("shape", f"Prometheus answered {type(body).__name__}, not an object")
    if body.get("status") != "success":
        raise MetricsRejected("query", f"Prometheus query failed: {str(body.get('errorType', ''))[:40]} "
                                       f"{str(body.get('error', 'no error given'))[:200]}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise MetricsRejected("shape", f"Prometheus answered {str(kind)[:40]!r}, not the matrix of a range selector")
    result = data.get("result")
    if not isinstance(result, list):
        raise MetricsRejected("shape", "Prometheus answer has no data.result list")
    if len(result) > MAX_SERIES:
        raise MetricsRejected("size", f"Prometheus answered {len(result)} series (at most {MAX_SERIES})")
    series: list[dict[str, Any]] = []
    total = 0
    for i, item in enumerate(result):
        metric = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise MetricsRejected("shape", f"data.result[{i}] must have a metric object and a values list")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            raise MetricsRejected("type", f"data.result[{i}].metric must map strings to strings")
        total += len(values)
        if total > MAX_PROMETHEUS_SAMPLES:
            raise MetricsRejected("size", f"Prometheus answered more than {MAX_PROMETHEUS_SAMPLES} samples")
        points = [_point(i, j, pair) for j, pair in enumerate(values)]
        series.append({"metric": metric, "values": points})
    return series


def _point(i: int, j: int, pair: Any) -> tuple[float, float]:
    where = f"data.result[{i}].values[{j}]"
    if not isinstance(pair, list) or len(pair) != 2:
        raise MetricsRejected("shape", f"{where} must be a [time, value] pair")
    stamp, raw = pair
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or not math.isfinite(stamp):
        raise MetricsRejected("type", f"{where}[0] must be a finite timestamp")
    if not isinstance(raw, str):  # Prometheus sends sample values as strings
        raise MetricsRejected("type", f"{where}[1] must be a string number, got {type(raw).__name__}")
    try:
        value = float(raw)
    except ValueError:
        raise MetricsRejected("value", f"{where}[1] {raw[:40]!r} is not a number") from None
    # +Inf is legitimate only as a bucket bound, which is a label; a sample value must be finite and sane.
    if not math.isfinite(value) or not -MAX_COUNT <= value <= MAX_COUNT:
        raise MetricsRejected("range", f"{where}[1] {raw[:40]!r} is out of range")
    return float(stamp), value


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
        body = decode_json(await read_bounded(resp))
    samples, latency = samples_from_matrix(parse_matrix(body), live_pods)
    return summarize(samples, latency, window_seconds=range_seconds, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
