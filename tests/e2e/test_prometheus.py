"""A real Prometheus (Debian's package) scraping the local cluster through the chart's own PodMonitor and
ServiceMonitor (hack/testenv/prometheus.py turns them into Kubernetes service discovery jobs, as the
Prometheus Operator would). Two engines take the same load: one tuned from its pods (``source: Pod``), one
from that Prometheus (``source: Prometheus``); both must decide the same way. Then the exposition of the
operator and of kvsim must pass ``promtool check metrics``, and every query of the Grafana dashboard must
return data from that Prometheus."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack import closedloop
from hack.testenv import cluster, kubesd, prometheus
from tests.e2e.conftest import ROOT, Operator, condition, kubectl, tuner_state, wait_for

CHART = ROOT / "charts" / "kvpilot"
DASHBOARD = CHART / "files" / "dashboards" / "kvpilot.json"
SCRAPE = {"interval": "2s", "scrapeTimeout": "1s"}
ENGINES = ("by-pod", "by-prom")
PROM_HOST = "prometheus.kvpilot-system.svc"


@pytest.fixture(scope="module")
def prom(operator: Operator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[prometheus.PrometheusServer]:
    """Prometheus with one job per chart monitor; the chart's metrics Service points at the operator's port."""
    start = time.monotonic()
    version = prometheus.ensure_installed()
    ns = closedloop.OPERATOR_NS
    cluster.helm("upgrade", "kvpilot", str(CHART), "-n", ns, "--reuse-values",
                 "--set", f"metrics.port={operator.metrics}")

    def operator_pod() -> bool:  # the chart's operator pod (kwok) declares the port the real operator serves
        pods = json.loads(kubectl("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=operator", "-o", "json"))
        return any(p.get("containerPort") == operator.metrics and pod["status"].get("podIP")
                   and not pod["metadata"].get("deletionTimestamp")
                   for pod in pods["items"] for c in pod["spec"]["containers"] for p in c.get("ports") or [])

    wait_for(operator_pod, 90, "the chart's operator pod with the operator's metrics port")
    values = {"engineMonitoring.podMonitor.enabled": "true", "metrics.serviceMonitor.enabled": "true",
              "metrics.port": str(operator.metrics)}
    for prefix in ("engineMonitoring.podMonitor", "metrics.serviceMonitor"):
        values.update({f"{prefix}.{k}": v for k, v in SCRAPE.items()})
    monitors = prometheus.chart_monitors(CHART, ns, values)
    assert {m["kind"] for m in monitors} == {"PodMonitor", "ServiceMonitor"}
    workdir = tmp_path_factory.mktemp("prometheus")
    discovery = None
    if prometheus.has_kubernetes_sd(workdir):
        config = prometheus.scrape_config(monitors, kubeconfig=cluster.kubeconfig_path())
    else:  # Debian's build: the same roles through HTTP SD
        discovery = kubesd.DiscoveryServer(prometheus.kubectl_lister)
        discovery.start()
        config = prometheus.scrape_config(monitors, sd_url=discovery.url)
    server = prometheus.PrometheusServer(workdir, config)
    server.start()
    # Engines name Prometheus as a cluster Service, as users do; this host has no cluster DNS, so the operator's
    # administrator pins the name to the server's address (--resolve, which also trusts that loopback address).
    operator.stop()
    operator.extra_args = ["--resolve", f"{PROM_HOST}:{server.port}:127.0.0.1"]
    operator.start()
    wait_for(lambda: server.query('up{job="kvpilot-metrics"} == 1'), 60,
             "Prometheus scraping the operator through the ServiceMonitor")
    how = "kubernetes_sd_configs" if discovery is None else "HTTP SD (kubesd.py)"
    sys.stderr.write(f"[prometheus] {version}, discovery by {how}, ready in {time.monotonic() - start:.1f}s "
                     f"at {server.url}\n")
    yield server
    server.stop()
    operator.stop()
    operator.extra_args = []
    operator.start()
    if discovery is not None:
        discovery.stop()


def _engine(ns: str, name: str, prom_url: str | None) -> dict[str, Any]:
    doc = closedloop.closed_loop_engine(ns, name, start_batch=4, replicas=1)
    # kvsim plays TensorRT-LLM 1.3: the first release whose TensorRT backend serves /prometheus/metrics (with
    # return_perf_metrics, PR #10662) and the KV and request gauges (PR #11243). On 1.2 there is nothing for
    # Prometheus to scrape from a TensorRT engine: use `source: Pod` there (docs/trtllm-releases.md).
    doc["spec"]["runtime"].setdefault("env", []).append({"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3"})
    if prom_url:
        doc["spec"]["autotune"]["metrics"] = {"source": "Prometheus", "url": prom_url}
    return doc


def _queries_answered(server: prometheus.PrometheusServer) -> float:
    """How many /api/v1/query requests Prometheus answered (its own counter)."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\} (\S+)$', text, re.M))


@pytest.fixture(scope="module")
def loop(prom: prometheus.PrometheusServer) -> Iterator[dict[str, Any]]:
    """Both engines under the same load until both retuned; what happened, for the tests below."""
    ns = f"e2e-prom-{int(time.time()) % 100000}"
    closedloop.create_namespace(ns)
    try:
        for name in ENGINES:
            url = f"http://{PROM_HOST}:{prom.port}" if name == "by-prom" else None
            kubectl("apply", "-f", "-", stdin=json.dumps(_engine(ns, name, url)))
        for name in ENGINES:
            kubectl("wait", "--for=condition=Available", f"ie/{name}", "-n", ns, "--timeout=180s")

        def scraped() -> bool:  # the PodMonitor's selector and port found each engine's pod
            up = prom.query(f'up{{namespace="{ns}",job="kvpilot-system/kvpilot-engines"}} == 1')
            return {r["metric"].get("engine") for r in up} == set(ENGINES)

        wait_for(scraped, 60, "Prometheus scraping both engines' pods through the PodMonitor")
        queries_before = _queries_answered(prom)
        started = time.time()
        stats = {name: closedloop.LoadStats() for name in ENGINES}

        async def drive() -> None:
            await asyncio.gather(*(closedloop.generate_load(
                lambda n=name: closedloop.ready_endpoints(ns, n), rate=12, seconds=75, prompt_words=200,
                max_tokens=200, stats=stats[name]) for name in ENGINES))

        asyncio.run(drive())

        def both_raised() -> dict[str, Any] | None:
            engines = {n: closedloop.get_engine(ns, n) for n in ENGINES}
            raised = all(e["status"]["batching"]["maxBatchSize"] > 4 for e in engines.values())
            return engines if raised else None

        try:
            engines = wait_for(both_raised, 60, "both engines raising their batch limit")
        except AssertionError as exc:
            sent = {name: (s.sent, s.errors) for name, s in stats.items()}
            raise AssertionError(f"{exc}; clients (sent, failed) {sent}\n{tuner_state(ns)}") from None
        yield {"ns": ns, "engines": engines, "stats": stats, "started": started,
               "operator_queries": _queries_answered(prom) - queries_before}
    finally:
        closedloop.discard_namespace(ns)


def test_the_tuner_decides_from_prometheus_as_it_does_from_the_pods(loop: dict[str, Any],
                                                                     prom: prometheus.PrometheusServer) -> None:
    by_pod, by_prom = (loop["engines"][n] for n in ENGINES)
    first = {n: e["status"]["autotune"]["history"][-1] for n, e in loop["engines"].items()}
    for name, decision in first.items():
        sys.stderr.write(f"[prometheus] {name}: {decision['action']} {decision['fromBatchSize']}->"
                         f"{decision['toBatchSize']} {decision['reason']}: {decision['message']}\n")
        assert decision["action"] == "Raise" and decision["fromBatchSize"] == 4 and decision["applied"] is True
        assert loop["stats"][name].ok > 0
    assert first["by-prom"]["reason"] == first["by-pod"]["reason"]
    assert by_prom["status"]["batching"]["reason"] == by_pod["status"]["batching"]["reason"] == "AutotuneRaised"
    # The Prometheus-tuned engine's pool is what Prometheus holds for it, read through the PodMonitor's labels.
    pool = prom.query(f'max(trtllm_kv_cache_max_blocks{{namespace="{loop["ns"]}",engine="by-prom"}})')
    assert by_prom["status"]["kvCache"]["maxBlocks"] == int(float(pool[0]["value"][1]))
    # Nobody but the operator queried Prometheus during the loop: one window query per reconcile.
    assert loop["operator_queries"] >= 3
    for name in ENGINES:
        assert condition(loop["engines"][name], "Available")["status"] == "True"


def promtool_check(text: str) -> str:
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    return (done.stdout + done.stderr).strip() if done.returncode or done.stdout.strip() or done.stderr.strip() else ""


def test_promtool_finds_nothing_to_fix_in_the_operator_and_kvsim_exposition(loop: dict[str, Any],
                                                                            operator: Operator) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics}/metrics", timeout=5) as r:
        operator_text = r.read().decode()
    assert "kvpilot_autotune_decisions_total" in operator_text
    assert promtool_check(operator_text) == "", "promtool on the operator's /metrics"
    endpoint = closedloop.ready_endpoints(loop["ns"], "by-prom")[0]
    with urllib.request.urlopen(f"http://{endpoint}/prometheus/metrics", timeout=5) as r:
        kvsim_text = r.read().decode()
    assert "trtllm_kv_cache_max_blocks" in kvsim_text
    assert promtool_check(kvsim_text) == "", "promtool on kvsim's /prometheus/metrics"


def dashboard_queries(path: Path, variables: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, expr) of every panel target and query variable, with Grafana's variables substituted."""
    board = json.loads(path.read_text())
    out = []
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["definition"]))
    for panel in board["panels"]:
        for target in panel.get("targets") or []:
            if target.get("expr"):
                out.append((panel.get("title", "?"), target["expr"]))
    subst = []
    for title, expr in out:
        for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
        assert "$" not in expr, f"{title}: unsubstituted variable in {expr}"
        subst.append((title, expr))
    return subst


def test_every_dashboard_query_returns_data_from_prometheus(loop: dict[str, Any],
                                                            prom: prometheus.PrometheusServer) -> None:
    # As Grafana sends them with both engines selected; $__rate_interval spans the whole loop.
    rate = f"{max(60, int(time.time() - loop['started']) + 60)}s"
    variables = {"namespace": loop["ns"], "engine": "by-pod|by-prom", "ttft_slo": "2.5", "tpot_slo": "0.05",
                 "__rate_interval": rate}
    empty, nan = [], []
    for title, expr in dashboard_queries(DASHBOARD, variables):
        if expr.startswith("label_values("):  # a Grafana function: the series API answers it
            metric, label = re.fullmatch(r"label_values\((.*), (\w+)\)", expr).groups()  # type: ignore[union-attr]
            values = {s.get(label) for s in prom.api("series", **{"match[]": metric})}
            if not values - {None}:
                empty.append(f"{title}: {expr}")
            continue
        result = prom.query(expr)
        if not result:
            empty.append(f"{title}: {expr}")
        elif all(math.isnan(float(r["value"][1])) for r in result):
            nan.append(title)
    sys.stderr.write(f"[prometheus] dashboard: {len(dashboard_queries(DASHBOARD, variables))} queries, "
                     f"NaN only (no observation in the range): {nan}\n")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
