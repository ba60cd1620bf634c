"""A load generator's view of a Service, routed the way a real gateway is: to the ready endpoints of
the pods the Service selects, updated as they change — never to a fixed list of pod IPs.

The local cluster has no kube-proxy, and kube-controller-manager refuses its loopback pod IPs in
Endpoints/EndpointSlices ("may not be in the loopback range"), so no EndpointSlice exists to follow.
``ready_addresses`` therefore applies the endpoints controller's own rules to the Service and its pods
(kubernetes pkg/controller/endpointslice and endpoint/util ``ShouldPodBeInEndpoints``, ``podutil.IsPodReady``):

- the Service's selector picks pods in its namespace (a Service without a selector has no managed endpoints);
- a pod without an IP, in a terminal phase, or terminating (deletionTimestamp set) serves no new traffic:
  the controller publishes terminating endpoints as ready=false, which gateways stop routing to;
- a pod counts when its Ready condition is True (or the Service publishes not-ready addresses);
- each Service port's targetPort is resolved against the pod's container ports (a name must match one).

``ServiceGateway`` re-reads the Service and its pods every ``period_s`` in a thread, so a retune's
terminating pod leaves the rotation within a fraction of its preStop delay.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any


def _selected(selector: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _target_port(pod: Mapping[str, Any], service_port: Mapping[str, Any]) -> int | None:
    target = service_port.get("targetPort", service_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    protocol = service_port.get("protocol", "TCP")
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target and port.get("protocol", "TCP") == protocol:
                return int(port["containerPort"])
    return None


def ready_addresses(service: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                    port_name: str | None = None) -> list[str]:
    """``ip:port`` of every endpoint the endpoints controller would publish as ready for ``service``'s
    port ``port_name`` (its first port when None), sorted."""
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    ports = spec.get("ports") or []
    port = next((p for p in ports if port_name is None or p.get("name") == port_name), None)
    if not selector or port is None:
        return []
    namespace = (service.get("metadata") or {}).get("namespace")
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("namespace", namespace) != namespace or not _selected(selector, meta.get("labels")):
            continue
        ip = status.get("podIP")
        if not ip or status.get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            continue
        if not (publish_not_ready or _ready(pod)):
            continue
        target = _target_port(pod, port)
        if target is not None:
            out.append(f"{ip}:{target}")
    return sorted(out)


class ServiceGateway:
    """Follows one Service's ready endpoints on the local cluster (admin kubeconfig)."""

    def __init__(self, namespace: str, service: str, port_name: str | None = "http", period_s: float = 0.25,
                 kubeconfig: str | None = None) -> None:
        from kubernetes import client, config

        self.namespace, self.service, self.port_name, self.period_s = namespace, service, port_name, period_s
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self._endpoints: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gateway-{service}", daemon=True)
        self.refresh()

    def refresh(self) -> list[str]:
        svc = self.api.api_client.sanitize_for_serialization(
            self.api.read_namespaced_service(self.service, self.namespace))
        selector = ",".join(f"{k}={v}" for k, v in ((svc.get("spec") or {}).get("selector") or {}).items())
        pods = self.api.api_client.sanitize_for_serialization(
            self.api.list_namespaced_pod(self.namespace, label_selector=selector)).get("items", []) if selector else []
        self._endpoints = ready_addresses(svc, pods, self.port_name)
        return self._endpoints

    def endpoints(self) -> list[str]:
        """The current ready endpoints (an in-memory read: cheap to call per request)."""
        return list(self._endpoints)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - keep routing to the last known endpoints, as a gateway does
                continue

    def __enter__(self) -> ServiceGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
