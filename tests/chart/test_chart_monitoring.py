"""ServiceMonitor (operator), PodMonitor (engine pods) and the dashboard ConfigMap: only when enabled,
and pointed at the right ports, paths and namespaces."""

from __future__ import annotations

import json

from chart_helpers import RELEASE_NAMESPACE, Manifest, objects_of_kind, only_object

MONITORING_KINDS = ("ServiceMonitor", "PodMonitor")


def test_nothing_for_prometheus_or_grafana_by_default(render) -> None:
    objects = render()
    for kind in MONITORING_KINDS:
        assert objects_of_kind(objects, kind) == [], kind
    assert objects_of_kind(objects, "ConfigMap") == []


def test_each_monitoring_object_follows_its_own_switch(render) -> None:
    only_service = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert len(objects_of_kind(only_service, "ServiceMonitor")) == 1
    assert objects_of_kind(only_service, "PodMonitor") == []
    only_pods = render({"engineMonitoring": {"podMonitor": {"enabled": True}}})
    assert len(objects_of_kind(only_pods, "PodMonitor")) == 1
    assert objects_of_kind(only_pods, "ServiceMonitor") == []


def test_service_monitor_scrapes_the_metrics_service(render) -> None:
    objects = render(ci_files=("monitoring-values.yaml",))
    monitor = only_object(objects, "ServiceMonitor")
    service = only_object(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # The operator's series carry the engine's namespace label; it must not be renamed exported_namespace.
    assert endpoint["honorLabels"] is True
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_service_monitor_without_service_is_refused(render_result) -> None:
    result = render_result({"metrics": {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}})
    assert result.returncode != 0
    assert "metrics.service.enabled" in result.stderr


def pod_monitor(objects: list[Manifest]) -> Manifest:
    monitor = only_object(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    return monitor


def test_pod_monitor_selects_engine_servers_on_their_metrics_path(render) -> None:
    monitor = pod_monitor(render(ci_files=("monitoring-values.yaml",)))
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "kvpilot",
        "app.kubernetes.io/component": "server",
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/prometheus/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    # The engine's name, from the label the operator puts on its pods, becomes the `engine` label.
    assert {
        "action": "replace",
        "sourceLabels": ["__meta_kubernetes_pod_label_serving_kvpilot_io_engine"],
        "targetLabel": "engine",
    } in endpoint["relabelings"]


def test_pod_monitor_is_limited_to_watched_namespaces(render) -> None:
    monitor = pod_monitor(render(ci_files=("namespaced-values.yaml", "monitoring-values.yaml")))
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_dashboard_config_map_carries_the_sidecar_label_and_valid_json(render) -> None:
    objects = render({"grafanaDashboard": {"enabled": True}})
    config_map = only_object(objects, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = config_map["data"]
    assert key.endswith(".json")
    dashboard = json.loads(config_map["data"][key])
    assert dashboard["uid"] == "kvpilot-overview"
    assert dashboard["panels"]
