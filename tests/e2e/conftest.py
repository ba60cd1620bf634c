"""End-to-end fixtures: a real control plane, the chart installed with real Helm, the operator running as a
local process under the chart's ServiceAccount (a token kubeconfig), so RBAC gaps fail tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack" / "testenv"))
import cluster  # noqa: E402

OPERATOR_NS = "kvpilot-system"
KVSIM_IMAGE = "ghcr.io/kvpilot/kvsim:0.1.0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 120) -> str:
    return cluster.kubectl(*args, stdin=stdin, check=check, timeout_s=timeout_s)


def run_kubectl(*args: str, stdin: str | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """kubectl with its exit code, stdout and stderr (for asserting on admission errors)."""
    argv = [str(cluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig_path()}", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, env=cluster.env())


def apply(doc: dict[str, Any] | str, *extra: str) -> str:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
    return kubectl("apply", "-f", "-", *extra, stdin=text)


def get(kind: str, name: str, ns: str) -> dict[str, Any] | None:
    out = kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(out) if out.strip().startswith("{") else None


def wait_for(predicate: Callable[[], Any], timeout_s: float = 90, what: str = "condition", every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def condition(ie: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((ie or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c  # type: ignore[no-any-return]
    return {}


@pytest.fixture(scope="session")
def kube() -> Path:
    return cluster.ensure_cluster_up()


@pytest.fixture(scope="session")
def chart(kube: Path) -> str:
    cluster.helm("upgrade", "--install", "kvpilot", str(ROOT / "charts/kvpilot"), "-n", OPERATOR_NS,
                 "--create-namespace", "--set", f"kvsimImage.tag={KVSIM_IMAGE.rsplit(':', 1)[1]}")
    kubectl("wait", "--for=condition=Established", "crd/inferenceengines.serving.kvpilot.io", "--timeout=60s")
    # The aggregated OpenAPI (kubectl explain, field validation) lags the CRD by a few seconds.
    wait_for(lambda: run_kubectl("explain", "inferenceengine.spec").returncode == 0, 60, "the CRD's OpenAPI")
    return OPERATOR_NS


class Operator:
    """The operator as a local process authenticated as the chart's ServiceAccount."""

    def __init__(self, kubeconfig: Path, logdir: Path):
        self.kubeconfig = kubeconfig
        self.logdir = logdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.logdir / f"operator-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.health = free_port()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.cli", "run", "--all-namespaces", "--metrics-port", "0",
             "--health-port", str(self.health), "--resync-seconds", "3", "--kvsim-image", KVSIM_IMAGE],
            env=env, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
        )
        wait_for(self._healthy, 60, "the operator's /healthz")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logdir.glob("operator-*.log")))


@pytest.fixture(scope="session")
def operator(chart: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    logdir = tmp_path_factory.mktemp("operator")
    token_kc = cluster.serviceaccount_kubeconfig(chart, "kvpilot", logdir / "sa.kubeconfig")
    op = Operator(token_kc, logdir)
    op.start()
    yield op
    op.stop()
    denied = [line for line in op.logs().splitlines() if "HTTP 403" in line or "forbidden" in line.lower()]
    assert not denied, "the operator hit RBAC denials:\n" + "\n".join(denied[:10])


def engines_volume(ns: str) -> str:
    """A hostPath PersistentVolume pre-bound to <ns>/engines (there is no storage provisioner)."""
    path = cluster.testenv_dir() / "volumes" / ns / "engines"
    path.mkdir(parents=True, exist_ok=True)
    return yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-engines",
                                                                     "labels": {"e2e-namespace": ns}},
         "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(path)},
                  "claimRef": {"namespace": ns, "name": "engines"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "engines", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{ns}-engines",
                  "resources": {"requests": {"storage": "100Gi"}}}},
    ])


@pytest.fixture
def ns(operator: Operator) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    apply(engines_volume(name))
    yield name
    kubectl("delete", "inferenceengines", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    kubectl("delete", "namespace", name, "--wait=true", "--timeout=90s", check=False)
    kubectl("delete", "pv", f"{name}-engines", "--wait=false", check=False)
    shutil.rmtree(cluster.testenv_dir() / "volumes" / name, ignore_errors=True)
