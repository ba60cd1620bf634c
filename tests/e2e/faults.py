"""What issue 22's fault trials share: a tenant who holds only ``kvpilot-edit`` in a team namespace (impersonated,
so RBAC sees that user), the simulated engine they run, and counters read from the operator and the API server."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from hack import closedloop
from hack.testenv import cluster
from tests.cases.engines import base, override
from tests.e2e.conftest import Operator, condition, get, kubectl
from tests.e2e.test_tenancy_policy import EDIT_ROLE, Tenant


def admin_client() -> k8s_client.ApiClient:
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig_path()), client_configuration=configuration)
    return k8s_client.ApiClient(configuration)


class Team:
    """A namespace (with the ``engines`` claim) and a tenant in it who holds only kvpilot-edit (``Tenant``, the
    impersonated user of the tenant-policy trial)."""

    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.namespace, self.user = f"team-{suffix}", f"tenant-{suffix}"
        self.tenant = Tenant(self.namespace, self.user)

    def create(self) -> None:
        closedloop.create_namespace(self.namespace)
        kubectl("create", "rolebinding", "tenant-edit", f"--clusterrole={EDIT_ROLE}", f"--user={self.user}",
                "-n", self.namespace)

    def delete(self) -> None:
        closedloop.discard_namespace(self.namespace)

    def submit(self, doc: dict[str, Any]) -> None:
        """Create an InferenceEngine as the tenant (kvpilot-edit grants create, not get: no apply)."""
        out = self.tenant.create(doc)
        assert out.returncode == 0, out.stderr

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        out = self.tenant.patch(name, patch)
        assert out.returncode == 0, f"the tenant could not patch {name}: {out.stderr}"

    def remove(self, name: str) -> None:
        out = self.tenant.kubectl("delete", "inferenceengine", name, "--wait=false")
        assert out.returncode == 0, out.stderr

    def engine(self, name: str) -> dict[str, Any]:
        return get("inferenceengine", name, self.namespace) or {}

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return condition(self.engine(name), type_)


def sim_engine(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A simulated engine that builds in a second and serves at once, sampled every second when autotuned."""
    doc = override(base(name, backend="simulated"),
                   runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "speedupRatio": 10, "buildSeconds": 1},
                   autotune={"enabled": False})
    doc = override(doc, **spec)
    doc["metadata"]["namespace"] = namespace
    return doc


def snapshot(kind: str, name: str, namespace: str) -> str:
    """The object as the API server holds it, every byte (resourceVersion, managedFields, owners, status)."""
    return kubectl("get", kind, name, "-n", namespace, "-o", "json")


def events(namespace: str, involved: str, reason: str) -> list[dict[str, Any]]:
    out = kubectl("get", "events", "-n", namespace, "--field-selector",
                  f"involvedObject.name={involved},reason={reason}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def operator_counter(operator: Operator, name: str, **labels: str) -> float:
    """A counter of the operator's own /metrics (the sum over the series with these labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


@contextmanager
def writes_to(namespace: str, name: str) -> Iterator[list[str]]:
    """Every write to the InferenceEngine while the block runs, as the API server reports it: a watch event per
    new resourceVersion (a status patch that changed nothing is not sent by the operator; one that changes
    something makes a new version). Yields the list of versions seen, filled as they come."""
    seen: list[str] = []
    stop = threading.Event()
    with admin_client() as api:
        custom = k8s_client.CustomObjectsApi(api)
        current: Any = custom.get_namespaced_custom_object("serving.kvpilot.io", "v1alpha1", namespace,
                                                           "inferenceengines", name)
        start = current["metadata"]["resourceVersion"]

        def follow() -> None:
            w = k8s_watch.Watch()
            rv = start
            while not stop.is_set():
                try:
                    for event in w.stream(custom.list_namespaced_custom_object, "serving.kvpilot.io", "v1alpha1",
                                          namespace, "inferenceengines", field_selector=f"metadata.name={name}",
                                          resource_version=rv, timeout_seconds=5):
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] == "MODIFIED":
                            seen.append(rv)
                        if stop.is_set():
                            break
                except (ApiException, OSError, ValueError):
                    continue

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        try:
            yield seen
        finally:
            stop.set()
            thread.join(15)


def pod_restarts(namespace: str, selector: str) -> dict[str, int]:
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))["items"]
    return {p["metadata"]["name"]: sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses") or [])
            for p in pods}


def jobs(namespace: str) -> list[str]:
    out = json.loads(kubectl("get", "jobs", "-n", namespace, "-o", "json"))["items"]
    return sorted(j["metadata"]["name"] for j in out)


def operator_log_lines(operator: Operator, words: str) -> int:
    return sum(1 for line in operator.logs().splitlines() if words in line)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def serving_ips(namespace: str, engine: str) -> list[str]:
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l",
                              f"serving.kvpilot.io/engine={engine},app.kubernetes.io/component=server",
                              "-o", "json"))["items"]
    return [p["status"]["podIP"] for p in pods if p["status"].get("podIP")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])]


@contextmanager
def trickle(namespace: str, engine: str, every_s: float = 0.5) -> Iterator[None]:
    """A light load on the engine's ready pods (a short completion every ``every_s``): an idle engine runs no
    iterations, so its pods report no samples."""
    stop = threading.Event()

    def send() -> None:
        body = json.dumps({"model": engine, "prompt": "Hello", "max_tokens": 16}).encode()
        while not stop.is_set():
            for ip in serving_ips(namespace, engine):
                request = urllib.request.Request(f"http://{ip}:8000/v1/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=10) as resp:
                        resp.read()
                except OSError:
                    pass
            stop.wait(every_s)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(15)
