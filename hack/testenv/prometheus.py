"""A real Prometheus for the local cluster, configured from the chart's own PodMonitor and ServiceMonitor.

The Prometheus Operator is not run here; instead this module does what it does with a PodMonitor or a
ServiceMonitor: it turns each one into a scrape job with Kubernetes service discovery against the local
API server (role ``pod`` / ``endpoints``), ``keep`` rules built from the monitor's label selector and port
name, the operator's standard target labels (namespace, pod, container, service, job, endpoint) and then the
monitor's own relabelings. So the chart's selectors and relabelings are what pick the targets: a selector
that matches nothing, or a port name the pods lack, leaves Prometheus with no target and the tests fail.

The server is Debian's ``prometheus`` package (installed with apt-get on first use when missing, shown as it
runs); it runs as a plain child process with its TSDB in a temporary directory (no systemd). Debian's build
lacks kubernetes_sd_configs, so discovery goes through kubesd.py (the same roles and meta labels over HTTP
SD); a build that has it (``has_kubernetes_sd``) gets kubernetes_sd_configs with the admin kubeconfig.

    from hack.testenv import prometheus
    monitors = prometheus.chart_monitors(chart_dir, namespace, {"engineMonitoring.podMonitor.enabled": "true"})
    server = prometheus.PrometheusServer(workdir, prometheus.scrape_config(monitors, sd_url=discovery.url))
    server.start(); server.query('up'); server.stop()
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hack.testenv import cluster

PACKAGES = ("prometheus",)  # Debian's package ships both prometheus and promtool


def ensure_installed() -> str:
    """Install Debian's prometheus package if ``prometheus`` or ``promtool`` is missing; returns its version.

    Idempotent and quiet when present. apt-get's own progress goes to stderr while it runs. The package's
    service is not started (no systemd here; policy-rc.d or the missing init system prevents it)."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        apt_install(PACKAGES)
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0] if out.stdout else out.stderr.splitlines()[0]


def apt_install(packages: tuple[str, ...]) -> None:
    """``apt-get install`` (after ``apt-get update`` when the lists lack the package), progress to stderr."""
    if os.geteuid() != 0:
        raise RuntimeError(f"{' '.join(packages)} missing and not root: install them (apt-get install {' '.join(packages)})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    known = subprocess.run(["apt-cache", "policy", *packages], capture_output=True, text=True, env=env).stdout
    if "Candidate: (none)" in known or not known.strip():
        _stream(["apt-get", "update", "-q"], env)
    _stream(["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "--no-install-recommends",
             *packages], env)


def _stream(argv: list[str], env: Mapping[str, str]) -> None:
    sys.stderr.write(f"[apt] {' '.join(argv)}\n")
    start = time.monotonic()
    done = subprocess.run(argv, env=dict(env), stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}")
    sys.stderr.write(f"[apt] done in {time.monotonic() - start:.0f}s\n")


def has_kubernetes_sd(workdir: Path) -> bool:
    """Whether this prometheus build has kubernetes_sd_configs (Debian's does not)."""
    probe = workdir / "probe.yml"
    probe.write_text(json.dumps({"scrape_configs": [{"job_name": "probe", "kubernetes_sd_configs": [{"role": "pod"}]}]}))
    return subprocess.run(["promtool", "check", "config", os.fspath(probe)], capture_output=True).returncode == 0


_LISTED: dict[tuple[str, tuple[str, ...]], tuple[float, list[dict[str, Any]]]] = {}
LIST_TTL_SECONDS = 1.0


def kubectl_lister(kind: str, namespaces: list[str]) -> list[dict[str, Any]]:
    """kubesd.py's view of the API server: ``kubectl get`` with the admin kubeconfig, reused for a second
    (the jobs refresh together; each kubectl costs CPU the e2e needs)."""
    key = (kind, tuple(namespaces))
    hit = _LISTED.get(key)
    if hit and time.monotonic() - hit[0] < LIST_TTL_SECONDS:
        return hit[1]
    items = _kubectl_list(kind, namespaces)
    _LISTED[key] = (time.monotonic(), items)
    return items


def _kubectl_list(kind: str, namespaces: list[str]) -> list[dict[str, Any]]:
    if not namespaces:
        return list(json.loads(cluster.kubectl("get", kind, "-A", "-o", "json", timeout_s=20))["items"])
    return [item for ns in namespaces
            for item in json.loads(cluster.kubectl("get", kind, "-n", ns, "-o", "json", timeout_s=20))["items"]]


def chart_monitors(chart_dir: Path, namespace: str, values: Mapping[str, str]) -> list[dict[str, Any]]:
    """The PodMonitor and ServiceMonitor objects the chart renders with these ``--set`` values."""
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    text = cluster.helm("template", "kvpilot", os.fspath(chart_dir), "-n", namespace, *sets)
    import yaml  # the project venv has it; the module stays importable without it for --help-like use

    docs = [d for d in yaml.safe_load_all(text) if d]
    return [d for d in docs if d.get("kind") in ("PodMonitor", "ServiceMonitor")]


def _label_name(label: str) -> str:
    """A Kubernetes label key as Prometheus' meta label suffix (serving.kvpilot.io/engine -> serving_kvpilot_io_engine)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _selector_keeps(selector: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    """``keep`` rules for a label selector, as the Prometheus Operator writes them (matchLabels and the
    In/NotIn/Exists/DoesNotExist expressions)."""
    rules: list[dict[str, Any]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        name = _label_name(key)
        rules.append({"action": "keep",
                      "source_labels": [f"__meta_kubernetes_{role}_label_{name}",
                                        f"__meta_kubernetes_{role}_labelpresent_{name}"],
                      "regex": f"({re.escape(str(value))});true"})
    for expr in selector.get("matchExpressions") or []:
        name, op = _label_name(expr["key"]), expr["operator"]
        values = "|".join(re.escape(v) for v in expr.get("values") or [])
        label, present = f"__meta_kubernetes_{role}_label_{name}", f"__meta_kubernetes_{role}_labelpresent_{name}"
        if op == "In":
            rules.append({"action": "keep", "source_labels": [label, present], "regex": f"({values});true"})
        elif op == "NotIn":
            rules.append({"action": "drop", "source_labels": [label, present], "regex": f"({values});true"})
        elif op == "Exists":
            rules.append({"action": "keep", "source_labels": [present], "regex": "true"})
        elif op == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": [present], "regex": "true"})
        else:
            raise ValueError(f"selector.matchExpressions operator {op!r}: must be In, NotIn, Exists or DoesNotExist")
    return rules


def _relabelings(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A monitor's relabelings (camelCase CRD fields) as Prometheus relabel_configs (snake_case)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
             "action": "action", "regex": "regex", "separator": "separator", "modulus": "modulus"}
    out = []
    for item in items or []:
        out.append({names[k]: v for k, v in item.items() if k in names})
    return out


def _namespaces(monitor: Mapping[str, Any]) -> dict[str, Any]:
    sel = monitor["spec"].get("namespaceSelector") or {}
    if sel.get("any"):
        return {}
    names = sel.get("matchNames") or [monitor["metadata"]["namespace"]]
    return {"namespaces": {"names": list(names)}}


def _discovery(sd_role: str, monitor: Mapping[str, Any], kubeconfig: Path | None, sd_url: str | None) -> dict[str, Any]:
    """kubernetes_sd_configs (upstream builds) or the same role through kubesd.py's HTTP SD (Debian's build)."""
    namespaces = _namespaces(monitor)
    if sd_url is None:
        if kubeconfig is None:
            raise ValueError("Prometheus discovery needs a kubeconfig (kubernetes_sd_configs) or an HTTP SD URL")
        return {"kubernetes_sd_configs": [{"role": sd_role, "kubeconfig_file": os.fspath(kubeconfig), **namespaces}]}
    names = ",".join(namespaces.get("namespaces", {}).get("names", []))
    url = f"{sd_url}/{sd_role}" + (f"?{urllib.parse.urlencode({'namespaces': names})}" if names else "")
    return {"http_sd_configs": [{"url": url, "refresh_interval": "5s"}]}


def _job(monitor: Mapping[str, Any], index: int, endpoint: Mapping[str, Any], kubeconfig: Path | None,
         role: str, sd_role: str, sd_url: str | None) -> dict[str, Any]:
    meta = monitor["metadata"]
    kind = "podMonitor" if role == "pod" else "serviceMonitor"
    port = endpoint["port"]
    relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    relabel += _selector_keeps(monitor["spec"].get("selector") or {}, "pod" if role == "pod" else "service")
    if role == "pod":
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        ]
    else:
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        ]
    relabel.append({"target_label": "endpoint", "replacement": str(port)})
    relabel += _relabelings(endpoint.get("relabelings"))
    job: dict[str, Any] = {
        "job_name": f"{kind}/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        **_discovery(sd_role, monitor, kubeconfig, sd_url),
        "metrics_path": endpoint.get("path", "/metrics"),
        "relabel_configs": relabel,
    }
    if endpoint.get("interval"):
        job["scrape_interval"] = endpoint["interval"]
    if endpoint.get("scrapeTimeout"):
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    return job


def scrape_config(monitors: list[dict[str, Any]], kubeconfig: Path | None = None, sd_url: str | None = None,
                  evaluation: str = "5s") -> dict[str, Any]:
    """prometheus.yml for these monitors: one job per PodMonitor podMetricsEndpoint / ServiceMonitor endpoint.
    Discovery: kubernetes_sd_configs with ``kubeconfig``, or kubesd.py's HTTP SD at ``sd_url``."""
    if (kubeconfig is None) == (sd_url is None):
        raise ValueError("scrape_config needs exactly one of kubeconfig (kubernetes_sd_configs) and sd_url (HTTP SD)")
    jobs = []
    for m in monitors:
        if m["kind"] == "PodMonitor":
            jobs += [_job(m, i, ep, kubeconfig, "pod", "pod", sd_url)
                     for i, ep in enumerate(m["spec"]["podMetricsEndpoints"])]
        elif m["kind"] == "ServiceMonitor":
            jobs += [_job(m, i, ep, kubeconfig, "service", "endpoints", sd_url)
                     for i, ep in enumerate(m["spec"]["endpoints"])]
    if not jobs:
        raise ValueError("no PodMonitor or ServiceMonitor rendered: enable them in the chart values")
    return {"global": {"scrape_interval": "15s", "evaluation_interval": evaluation}, "scrape_configs": jobs}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """prometheus as a child process on a free local port, its config checked by promtool first."""

    def __init__(self, workdir: Path, config: Mapping[str, Any]) -> None:
        self.workdir = workdir
        self.config = dict(config)
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self, timeout_s: float = 60) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config, indent=1))  # JSON is YAML
        check = subprocess.run(["promtool", "check", "config", os.fspath(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"promtool rejects the generated config {config}:\n{check.stdout}{check.stderr}")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
             "--storage.tsdb.retention.time=2h"],
            stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus never became ready:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.3)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else RuntimeError with Prometheus' error."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=promql)["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])
