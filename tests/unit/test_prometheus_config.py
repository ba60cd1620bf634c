"""The e2e Prometheus' configuration: the chart's monitors as scrape jobs (hack/testenv/prometheus.py) and the
HTTP SD emulation of Kubernetes discovery (hack/testenv/kubesd.py). Pure functions, no cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack.testenv import kubesd, prometheus

ROOT = Path(__file__).resolve().parents[2]

POD_MONITOR = {
    "kind": "PodMonitor", "metadata": {"name": "kvpilot-engines", "namespace": "kvpilot-system"},
    "spec": {"namespaceSelector": {"any": True},
             "selector": {"matchLabels": {"app.kubernetes.io/managed-by": "kvpilot",
                                          "app.kubernetes.io/component": "server"}},
             "podMetricsEndpoints": [{"port": "http", "path": "/prometheus/metrics", "interval": "2s",
                                      "relabelings": [{"action": "replace", "targetLabel": "engine",
                                                       "sourceLabels": ["__meta_kubernetes_pod_label_serving_kvpilot_io_engine"]}]}]},
}
POD = {
    "metadata": {"name": "e-1", "namespace": "ns", "uid": "u", "labels": {
        "app.kubernetes.io/managed-by": "kvpilot", "app.kubernetes.io/component": "server",
        "serving.kvpilot.io/engine": "e"}},
    "spec": {"nodeName": "n", "containers": [{"name": "server", "image": "i", "ports": [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"}]}]},
    "status": {"podIP": "127.32.0.5", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    """Prometheus' relabeling for the actions the jobs use (keep, drop, replace), to check the rules' intent."""
    out = dict(labels)
    for r in rules:
        value = r.get("separator", ";").join(out.get(s, "") for s in r.get("source_labels", []))
        m = re.fullmatch(r.get("regex", "(.*)"), value)
        action = r.get("action", "replace")
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            out[r["target_label"]] = m.expand(r.get("replacement", "$1").replace("$1", r"\1"))
    return out


def test_the_pod_monitor_keeps_the_serving_pod_and_labels_it_like_the_operator() -> None:
    job = prometheus.scrape_config([POD_MONITOR], sd_url="http://sd")["scrape_configs"][0]
    assert job["http_sd_configs"][0]["url"] == "http://sd/pod" and job["metrics_path"] == "/prometheus/metrics"
    [group] = kubesd.pod_targets([POD])
    assert group["targets"] == ["127.32.0.5:8000"]
    labels = relabel(group["labels"], job["relabel_configs"])
    assert labels is not None
    assert {k: labels[k] for k in ("namespace", "pod", "engine", "job", "endpoint")} == {
        "namespace": "ns", "pod": "e-1", "engine": "e", "job": "kvpilot-system/kvpilot-engines", "endpoint": "http"}
    other = {**POD, "metadata": {**POD["metadata"], "labels": {"app.kubernetes.io/component": "server"}}}
    assert relabel(kubesd.pod_targets([other])[0]["labels"], job["relabel_configs"]) is None


def test_the_service_monitor_selects_endpoints_by_the_service_labels_and_port_name() -> None:
    monitor = {"kind": "ServiceMonitor", "metadata": {"name": "kvpilot", "namespace": "kvpilot-system"},
               "spec": {"namespaceSelector": {"matchNames": ["kvpilot-system"]},
                        "selector": {"matchLabels": {"app.kubernetes.io/name": "kvpilot"}},
                        "endpoints": [{"port": "metrics", "honorLabels": True}]}}
    job = prometheus.scrape_config([monitor], sd_url="http://sd")["scrape_configs"][0]
    assert job["honor_labels"] is True and job["http_sd_configs"][0]["url"] == "http://sd/endpoints?namespaces=kvpilot-system"
    svc = {"metadata": {"name": "kvpilot-metrics", "namespace": "kvpilot-system", "labels": {"app.kubernetes.io/name": "kvpilot"}},
           "spec": {"selector": {"app": "op"}, "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics"},
                                                          {"name": "x", "port": 1, "targetPort": 8081}]}}
    pod = {"metadata": {"name": "op-1", "namespace": "kvpilot-system", "labels": {"app": "op"}},
           "spec": {"containers": [{"name": "operator", "ports": [{"name": "metrics", "containerPort": 9100},
                                                                  {"name": "health", "containerPort": 8081}]}]},
           "status": {"podIP": "127.33.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}
    elsewhere = {**pod, "metadata": {**pod["metadata"], "namespace": "other"}}
    groups = kubesd.endpoints_targets([svc], [pod, elsewhere])
    assert sorted(g["targets"][0] for g in groups) == ["127.33.0.9:8081", "127.33.0.9:9100"]
    kept = [relabel(g["labels"], job["relabel_configs"]) for g in groups]
    kept = [k for k in kept if k is not None]
    assert [(k["__address__"] if "__address__" in k else None, k["service"], k["pod"], k["endpoint"]) for k in kept] == [
        (None, "kvpilot-metrics", "op-1", "metrics")]


def test_kubernetes_sd_when_the_build_has_it_and_bad_selectors_are_refused() -> None:
    job = prometheus.scrape_config([POD_MONITOR], kubeconfig=Path("/kc"))["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/kc"}]
    with pytest.raises(ValueError, match="exactly one"):
        prometheus.scrape_config([POD_MONITOR])
    bad = {**POD_MONITOR, "spec": {**POD_MONITOR["spec"], "selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}}
    with pytest.raises(ValueError, match="operator 'Gt'"):
        prometheus.scrape_config([bad], sd_url="http://sd")
