"""The Grafana dashboard (charts/kvpilot/files/dashboards/kvpilot.json): valid, every query parses, every
metric it names exists, and it shows what issue 5 asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from chart_helpers import CHART_DIR, REPO_ROOT

DASHBOARD_FILE = CHART_DIR / "files" / "dashboards" / "kvpilot.json"

# The operator's metrics (the contract of operator/kvpilot, prometheus-client on --metrics-port).
KVPILOT_METRICS = {
    "kvpilot_reconcile_total": "counter",
    "kvpilot_reconcile_duration_seconds": "histogram",
    "kvpilot_engine_builds_total": "counter",
    "kvpilot_engine_build_duration_seconds": "histogram",
    "kvpilot_rollouts_total": "counter",
    "kvpilot_batch_size": "gauge",
    "kvpilot_kv_cache_utilization_ratio": "gauge",
    "kvpilot_autotune_decisions_total": "counter",
    "kvpilot_autotune_recommended_batch_size": "gauge",
    "kvpilot_autotune_canaries_total": "counter",
}
# trtllm-serve's Prometheus names (NVIDIA/TensorRT-LLM @ 050f80def8df236e326949c8bd9dee10fd896a83 :
# tensorrt_llm/metrics/collector.py), the subset the dashboard may use.
TRTLLM_METRICS = {
    "trtllm_kv_cache_utilization": "gauge",
    "trtllm_num_requests_running": "gauge",
    "trtllm_num_requests_waiting": "gauge",
    "trtllm_num_paused_requests": "gauge",
    "trtllm_max_batch_size_runtime": "gauge",
    "trtllm_max_batch_size_static": "gauge",
    "trtllm_request_success_total": "counter",
    "trtllm_time_to_first_token_seconds": "histogram",
    "trtllm_time_per_output_token_seconds": "histogram",
    "trtllm_e2e_request_latency_seconds": "histogram",
}
# Default histogram buckets of trtllm-serve (same file): an SLO picker may only offer these bounds.
TTFT_BUCKETS = {
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
}
TPOT_BUCKETS = {
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
}

# Grafana's built-in variables and what to put in their place to parse a query.
BUILTIN_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
METRIC_NAME = re.compile(r"\b((?:kvpilot|trtllm)_[a-z0-9_]+)")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels") or [])
    return panels


def all_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in all_panels(dashboard) for t in p.get("targets") or []]


def series_names(metric: str, kind: str) -> set[str]:
    """The series names a metric exposes: a histogram's _bucket/_count/_sum."""
    if kind == "histogram":
        return {f"{metric}_bucket", f"{metric}_count", f"{metric}_sum"}
    return {metric}


KNOWN_SERIES = {s for table in (KVPILOT_METRICS, TRTLLM_METRICS) for m, k in table.items() for s in series_names(m, k)}


def metrics_in(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def substitute(expr: str, dashboard: dict[str, Any]) -> str:
    """The query as Grafana would send it, with each variable at its default (custom) or match-all value."""
    defined = variables(dashboard)

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        variable = defined[name]
        if variable["type"] == "custom":
            return str(variable["current"]["value"])
        return ".*"

    return VARIABLE.sub(value, expr)


def test_dashboard_is_valid_json_with_unique_panel_ids() -> None:
    dashboard = load_dashboard()
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in all_panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_series_the_dashboard_queries_exists() -> None:
    for title, expr in all_exprs(load_dashboard()):
        unknown = metrics_in(expr) - KNOWN_SERIES
        assert not unknown, f"panel {title!r} queries unknown series {sorted(unknown)}"


def test_every_variable_a_query_uses_is_defined() -> None:
    dashboard = load_dashboard()
    defined = set(variables(dashboard)) | set(BUILTIN_VARIABLES)
    for title, expr in all_exprs(dashboard):
        used = {a or b for a, b in VARIABLE.findall(expr)}
        assert used <= defined, f"panel {title!r} uses undefined {sorted(used - defined)}"


def test_every_query_parses_as_promql() -> None:
    promql_parser = pytest.importorskip("promql_parser", reason="pip install promql-parser to parse the queries")
    dashboard = load_dashboard()
    for title, expr in all_exprs(dashboard):
        try:
            promql_parser.parse(substitute(expr, dashboard))
        except ValueError as error:
            pytest.fail(f"panel {title!r}: {error}\n{expr}")


@pytest.mark.parametrize(
    ("what", "series"),
    [
        ("KV utilization per pod", "trtllm_kv_cache_utilization"),
        ("runtime batch size", 'kvpilot_batch_size{namespace=~"$namespace", name=~"$engine", kind="runtime"}'),
        ("engine ceiling", 'kvpilot_batch_size{namespace=~"$namespace", name=~"$engine", kind="ceiling"}'),
        ("queue waiting", "trtllm_num_requests_waiting"),
        ("queue running", "trtllm_num_requests_running"),
        ("paused requests", "trtllm_num_paused_requests"),
        ("autotune decisions", "kvpilot_autotune_decisions_total"),
        ("TTFT", "trtllm_time_to_first_token_seconds_bucket"),
        ("TPOT", "trtllm_time_per_output_token_seconds_bucket"),
        ("goodput under TTFT SLO", 'le=~"$ttft_slo"'),
        ("goodput under TPOT SLO", 'le=~"$tpot_slo"'),
    ],
)
def test_dashboard_shows(what: str, series: str) -> None:
    assert any(series in expr for _, expr in all_exprs(load_dashboard())), f"no panel shows {what}"


def test_engine_pod_series_are_filtered_by_namespace_and_engine() -> None:
    """trtllm_* series come from the PodMonitor, which adds `engine`; each query must select on it."""
    for title, expr in all_exprs(load_dashboard()):
        for selector in re.findall(r"trtllm_[a-z_]+\{([^}]*)\}", expr):
            assert 'engine=~"$engine"' in selector and 'namespace=~"$namespace"' in selector, (title, selector)


def test_latency_panels_show_p50_and_p95() -> None:
    for metric in ("trtllm_time_to_first_token_seconds", "trtllm_time_per_output_token_seconds"):
        exprs = [e for _, e in all_exprs(load_dashboard()) if f"{metric}_bucket" in e and "histogram_quantile" in e]
        quantiles = {q for e in exprs for q in re.findall(r"histogram_quantile\((0\.\d+)", e)}
        assert {"0.5", "0.95"} <= quantiles, metric


@pytest.mark.parametrize(("name", "buckets"), [("ttft_slo", TTFT_BUCKETS), ("tpot_slo", TPOT_BUCKETS)])
def test_slo_choices_are_histogram_bucket_bounds(name: str, buckets: set[float]) -> None:
    variable = variables(load_dashboard())[name]
    assert variable["options"]
    for option in variable["options"]:
        spellings = option["value"].split("|")
        assert {float(s) for s in spellings} <= buckets, option
        # Prometheus stores a whole-number bound as "1" or "1.0" depending on version: list both.
        if float(spellings[0]).is_integer():
            bound = float(spellings[0])
            assert {f"{bound:.0f}", f"{bound:.1f}"} <= set(spellings), option


def test_operator_metric_names_are_defined_by_the_operator() -> None:
    """Once the operator defines its metrics, every kvpilot_* name the dashboard uses must be among them."""
    sources = "\n".join(p.read_text() for p in Path(REPO_ROOT / "operator" / "kvpilot").rglob("*.py"))
    used = {m for _, e in all_exprs(load_dashboard()) for m in metrics_in(e) if m.startswith("kvpilot_")}
    bases = {re.sub(r"_(bucket|count|sum)$", "", m) for m in used}
    # prometheus-client appends _total to counters, so a source may name either form.
    declared = {b for b in bases if b in sources or b.removesuffix("_total") in sources}
    if not declared:
        pytest.skip("operator/kvpilot defines no kvpilot_* metric yet")
    assert declared == bases, f"not defined in operator/kvpilot: {sorted(bases - declared)}"
