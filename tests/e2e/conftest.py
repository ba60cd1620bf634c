"""End-to-end fixtures: a real control plane, the chart installed with real Helm, and the operator under the
chart's ServiceAccount, so RBAC gaps fail tests. The operator runs from its real image under podman, as the
chart's Deployment defines it (hack/operatorimage.py), when `make images` has built it; otherwise (no podman,
or KVPILOT_E2E_OPERATOR=process) as a local process under a token kubeconfig. The summary says which ran,
and how the local kubelet ran the kvsim pods (podman from the kvsim image, or local processes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import closedloop, operatorimage
from hack.testenv import cluster

ROOT = Path(__file__).resolve().parents[2]

OPERATOR_NS = closedloop.OPERATOR_NS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 120) -> str:
    return cluster.kubectl(*args, stdin=stdin, check=check, timeout_s=timeout_s)


def run_kubectl(*args: str, stdin: str | None = None, timeout_s: float = 120,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with its exit code, stdout and stderr (for asserting on admission errors); ``env`` adds to the
    cluster's environment."""
    argv = [str(cluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig_path()}", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout_s,
                          env={**cluster.env(), **(env or {})})


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


# Set to keep the local control plane running after the session for the next run; else a session that started it
# stops it when it ends (etcd, kube-apiserver, the controllers, kwok and the local kubelet hold ~700 MiB).
KEEP_CLUSTER_ENV = "KVPILOT_KEEP_CLUSTER"


def control_plane_answers() -> bool:
    """Whether a control plane (started by someone else: `make cluster-up`, an earlier kept run) already answers."""
    try:
        return kubectl("get", "--raw=/readyz", check=False, timeout_s=10).strip() == "ok"
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def kube() -> Iterator[Path]:
    started = not control_plane_answers()
    yield cluster.ensure_cluster_up()
    if started and not os.environ.get(KEEP_CLUSTER_ENV):
        cluster.cluster_down()


@pytest.fixture(scope="session")
def chart(kube: Path) -> str:
    closedloop.install_chart()
    # The aggregated OpenAPI (kubectl explain, field validation) lags the CRD by a few seconds.
    wait_for(lambda: run_kubectl("explain", "inferenceengine.spec").returncode == 0, 60, "the CRD's OpenAPI")
    return OPERATOR_NS


Operator = closedloop.OperatorProcess | operatorimage.OperatorContainer
OPERATOR_IMAGE = f"ghcr.io/kvpilot/kvpilot:{closedloop.KVSIM_IMAGE.rsplit(':', 1)[1]}"
RUNNERS: dict[str, str] = {}  # what ran, for the terminal summary


def make_operator(logdir: Path) -> Operator:
    """The operator image under podman when it is built (KVPILOT_E2E_OPERATOR=auto|image|process)."""
    try:
        op, how = operatorimage.make_operator(logdir, OPERATOR_NS, closedloop.KVSIM_IMAGE, OPERATOR_IMAGE)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    RUNNERS["operator"] = how
    return op  # type: ignore[no-any-return]


KUBELET_LOG_START: dict[str, int] = {}


def kubelet_log() -> Path:
    return cluster.testenv_dir() / "logs" / "localkubelet.log"


def container_runners() -> str:
    """How the local kubelet started containers during this session (its log says `runner podman|process`)."""
    start = KUBELET_LOG_START.get("offset")
    if start is None or not kubelet_log().exists():
        return "unknown (no local kubelet log)"
    with kubelet_log().open("rb") as log:
        log.seek(start)
        text = log.read().decode("utf-8", "replace")
    counts = {kind: text.count(f"(runner {kind}, image ") for kind in ("podman", "process")}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if RUNNERS:
        RUNNERS["simulated-pod containers started"] = container_runners()
        terminalreporter.write_sep("-", "kvpilot e2e runners")
        for what, how in RUNNERS.items():
            terminalreporter.write_line(f"{what}: {how}")


@pytest.fixture(scope="session")
def operator(chart: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = make_operator(tmp_path_factory.mktemp("operator"))
    KUBELET_LOG_START["offset"] = kubelet_log().stat().st_size if kubelet_log().exists() else 0
    op.start()
    yield op
    op.stop()
    # A write into a namespace being deleted is refused with 403 NamespaceTerminating (a race with the test's own
    # teardown), and an admission policy's refusal also reads "is forbidden" (the fault trials install one):
    # neither is a permission the chart's RBAC lacks.
    denied = [line for line in op.logs().splitlines() if ("HTTP 403" in line or "forbidden" in line.lower())
              and "because it is being terminated" not in line and "ValidatingAdmissionPolicy" not in line]
    assert not denied, "the operator hit RBAC denials:\n" + "\n".join(denied[:10])


@pytest.fixture
def ns(operator: Operator) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    closedloop.create_namespace(name)
    yield name
    closedloop.discard_namespace(name)
    shutil.rmtree(cluster.testenv_dir() / "volumes" / name, ignore_errors=True)


def tuner_state(ns: str) -> str:
    """Each InferenceEngine's tuner state in ``ns``: the value in force, the recommendation and the last decisions,
    so that a test that waited in vain for a retune says why the tuner held (the operator logs no decision). It
    never raises: a diagnostic must not hide the failure it explains."""
    try:
        out = kubectl("get", "inferenceengines", "-n", ns, "-o", "json", check=False, timeout_s=15)
    except Exception as exc:  # noqa: BLE001 -- e.g. kubectl timed out
        return f"tuner state unreadable: {exc}"
    if not out.strip().startswith("{"):
        return f"no InferenceEngines readable in {ns}"
    lines = []
    for item in json.loads(out).get("items", []):
        status = item.get("status") or {}
        tune = status.get("autotune") or {}
        conditions = {c.get("type"): f"{c.get('status')}/{c.get('reason')}" for c in status.get("conditions") or []}
        lines.append(f"{item['metadata']['name']}: maxBatchSize {(status.get('batching') or {}).get('maxBatchSize')}; "
                     f"conditions {conditions}")
        lines.append(f"  recommendation {json.dumps(tune.get('recommendation'))}")
        lines.extend(f"  history {json.dumps(h)}" for h in (tune.get("history") or [])[-5:])
        lines.extend(f"  {key} {json.dumps(value)}" for key, value in tune.items()
                     if key not in ("recommendation", "history"))
    return "\n".join(lines) or f"no InferenceEngines in {ns}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    namespace = getattr(item, "funcargs", {}).get("ns")
    if report.failed and call.when == "call" and isinstance(namespace, str):
        report.sections.append(("kvpilot tuner state", tuner_state(namespace)))
    return report
