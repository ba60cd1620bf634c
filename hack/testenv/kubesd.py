"""Kubernetes service discovery for Debian's Prometheus, served over Prometheus' HTTP SD protocol.

Debian builds prometheus without the Kubernetes discovery (its client-go is not packaged: ``promtool check
config`` says "field kubernetes_sd_configs not found"). So this small server reads pods, Endpoints and
Services from the API server on each refresh and answers HTTP SD target groups carrying the same
``__meta_kubernetes_*`` labels the ``pod`` and ``endpoints`` roles of kubernetes_sd_config set (Prometheus
docs, configuration.md, <kubernetes_sd_config>); the endpoints come from the Services' selectors (see
``endpoints_targets``: the API server refuses loopback pod IPs in Endpoints). Everything after discovery — the monitors' keep rules, the
relabelings, the scrapes — is Prometheus' own, so the chart's selectors are what pick the targets.

    GET /pod?namespaces=a,b        one target per container port of every pod with an IP
    GET /endpoints?namespaces=a    one target per Service port and pod its selector picks
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Lister = Callable[[str, list[str]], list[dict[str, Any]]]  # (kind plural, namespaces or []) -> items


def _name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _object_labels(role: str, meta: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in (meta.get("labels") or {}).items():
        out[f"__meta_kubernetes_{role}_label_{_name(key)}"] = str(value)
        out[f"__meta_kubernetes_{role}_labelpresent_{_name(key)}"] = "true"
    for key, value in (meta.get("annotations") or {}).items():
        out[f"__meta_kubernetes_{role}_annotation_{_name(key)}"] = str(value)
        out[f"__meta_kubernetes_{role}_annotationpresent_{_name(key)}"] = "true"
    return out


def _pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    owner: dict[str, Any] = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), {})
    labels = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_ready": "true" if ready else "false",
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        "__meta_kubernetes_pod_controller_kind": owner.get("kind", ""),
        "__meta_kubernetes_pod_controller_name": owner.get("name", ""),
    }
    labels.update(_object_labels("pod", meta))
    return labels


def _container_port(container: dict[str, Any], port: dict[str, Any]) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_image": container.get("image", ""),
        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
        "__meta_kubernetes_pod_container_init": "false",
    }


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``pod`` role: one target group per pod, a target per declared container port."""
    groups = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        base = _pod_labels(pod)
        for container in (pod.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                groups.append({"targets": [f"{ip}:{port['containerPort']}"],
                               "labels": {**base, **_container_port(container, port)}})
    return groups


def _target_port(pod: dict[str, Any], target: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(container, container port) a Service's targetPort (number or name) resolves to on this pod."""
    for container in pod["spec"].get("containers") or []:
        for cport in container.get("ports") or []:
            if target == cport.get("name") or target == cport["containerPort"]:
                return container, cport
    return None


def endpoints_targets(services: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``endpoints`` role: a target per Service port and selected pod, with the Service's and the pod's labels.

    The endpoints are computed from each Service's selector, as the endpoints controller does, rather than read
    from Endpoints objects: the local cluster's pod IPs are loopback addresses, which the API server refuses in
    Endpoints and EndpointSlices ("may not be in the loopback range"), so those stay empty here."""
    groups = []
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector:
            continue
        base = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_endpoints_name": meta["name"],
                "__meta_kubernetes_service_name": meta["name"], **_object_labels("service", meta)}
        for pod in pods:
            pmeta = pod["metadata"]
            labels_ = pmeta.get("labels") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if pmeta["namespace"] != meta["namespace"] or not ip or pmeta.get("deletionTimestamp"):
                continue
            if any(labels_.get(k) != v for k, v in selector.items()):
                continue
            pod_labels = _pod_labels(pod)
            for port in spec.get("ports") or []:
                resolved = _target_port(pod, port.get("targetPort", port["port"]))
                if resolved is None:
                    continue
                container, cport = resolved
                labels = {**base, **pod_labels, **_container_port(container, cport),
                          "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                          "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                          "__meta_kubernetes_endpoint_ready": pod_labels["__meta_kubernetes_pod_ready"],
                          "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                          "__meta_kubernetes_endpoint_address_target_name": pmeta["name"],
                          "__meta_kubernetes_endpoint_node_name": pod["spec"].get("nodeName", "")}
                groups.append({"targets": [f"{ip}:{cport['containerPort']}"], "labels": labels})
    return groups


class DiscoveryServer:
    """The HTTP SD endpoint on 127.0.0.1, in a daemon thread; ``lister`` reads the API server."""

    def __init__(self, lister: Lister) -> None:
        self.lister = lister
        discovery = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urllib.parse.urlparse(self.path)
                namespaces = [n for n in urllib.parse.parse_qs(url.query).get("namespaces", [""])[0].split(",") if n]
                try:
                    body = json.dumps(discovery.targets(url.path.strip("/"), namespaces)).encode()
                    code = 200
                except Exception as exc:  # noqa: BLE001 - Prometheus keeps its last targets on an error answer
                    body, code = str(exc).encode(), 500
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # Prometheus gave up on a slow answer; it asks again at the next refresh

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kubesd", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def targets(self, role: str, namespaces: list[str]) -> list[dict[str, Any]]:
        if role == "pod":
            return pod_targets(self.lister("pods", namespaces))
        if role == "endpoints":
            return endpoints_targets(self.lister("services", namespaces), self.lister("pods", namespaces))
        raise ValueError(f"role {role!r}: must be pod or endpoints")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
