"""End-to-end tests of the local control plane itself: fake GPU nodes, kwok stages, the local kubelet.

They run against the real API server started by hack/testenv/cluster-up.sh (see conftest.py) and check
what the kvpilot e2e tests rely on: scheduling against `nvidia.com/gpu`, kwok completing and failing
Jobs, and simulated-backend pods really running on their 127.2.x.y IP with probes, exit codes,
termination messages, restarts and graceful deletion.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hack.testenv import cluster

pytestmark = pytest.mark.e2e

SIM = {"serving.kvpilot.io/backend": "simulated"}


def apply(ns: str, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
    """Create the given objects in namespace `ns`."""
    items = manifest if isinstance(manifest, list) else [manifest]
    cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def get(ns: str, kind: str, name: str) -> dict[str, Any]:
    """One object as a dict."""
    return json.loads(cluster.kubectl("get", kind, name, "-n", ns, "-o", "json"))


def pods(ns: str, selector: str) -> list[dict[str, Any]]:
    """The pods matching a label selector."""
    return json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))["items"]


def wait_until(what: str, probe: Callable[[], Any], timeout_s: float = 60) -> Any:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; last value: {last!r}")


def sim_pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A bare simulated-backend pod with one container."""
    container = {"name": "main", "image": "kvsim", "command": command, **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(SIM)},
        "spec": {"containers": [container], **spec},
    }


def job(name: str, template: dict[str, Any], backoff_limit: int = 0) -> dict[str, Any]:
    """A Job around a pod template."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": backoff_limit, "template": template},
    }


def terminated_of(pod: dict[str, Any]) -> dict[str, Any]:
    """The first container's terminated state ({} if it is not terminated)."""
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("state", {}).get("terminated") or {}


def engine_volume(ns: str, path: Path) -> list[dict[str, Any]]:
    """A hostPath PV pre-bound to PVC `engines` in `ns`, as the kvpilot e2e tests use for the engine cache."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{ns}-engines"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": ns,
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": ns, "name": "engines"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "engines"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": ns, "resources": {"requests": {"storage": "1Gi"}}},
    }
    return [pv, pvc]


def test_fake_gpu_nodes_offer_eight_gpus_and_the_product_label(testenv_cluster: Path) -> None:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json"))["items"]
    by_product: dict[str, int] = {}
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        product = node["metadata"]["labels"]["nvidia.com/gpu.product"]
        by_product[product] = by_product.get(product, 0) + 1
    assert by_product.get("NVIDIA-H100-80GB-HBM3", 0) >= 2


def test_a_pod_asking_more_gpus_than_any_node_has_stays_pending(ns: str) -> None:
    pod = sim_pod("greedy", ["sleep", "60"], container={"resources": {"limits": {"nvidia.com/gpu": 9}}})
    apply(ns, pod)

    def unschedulable() -> dict | None:
        conds = get(ns, "pod", "greedy").get("status", {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    cond = wait_until("PodScheduled=False", unschedulable)
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert get(ns, "pod", "greedy")["status"]["phase"] == "Pending"


def test_kwok_completes_and_fails_jobs_and_readies_ordinary_pods(ns: str) -> None:
    plain = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "builder"}]}
    failing = {
        "metadata": {
            "labels": {"kwok.x-k8s.io/fail": "true"},
            "annotations": {"kwok.x-k8s.io/fail-exit-code": "7", "kwok.x-k8s.io/fail-message": "no such checkpoint"},
        },
        "spec": plain,
    }
    apply(ns, [job("builds", {"spec": plain}), job("breaks", failing)])
    wait_until("Job builds Complete", lambda: get(ns, "job", "builds")["status"].get("succeeded") == 1)
    wait_until("Job breaks Failed", lambda: get(ns, "job", "breaks")["status"].get("failed") == 1)
    term = terminated_of(pods(ns, "job-name=breaks")[0])
    assert (term["exitCode"], term["message"]) == (7, "no such checkpoint")
    ok_pod = pods(ns, "job-name=builds")[0]
    assert ipaddress.ip_address(ok_pod["status"]["podIP"]) in ipaddress.ip_network(cluster.settings()["KWOK_CIDR"])


def test_simulated_deployment_serves_on_its_own_pod_ip(ns: str) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"}, "data": {"index.html": "hi\n"}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tok"}, "stringData": {"t": "s3cr3t"}}
    template = {
        "metadata": {"labels": {"app": "web", **SIM}},
        "spec": {
            "initContainers": [
                {
                    "name": "prep",
                    "image": "kvsim",
                    "command": ["sh", "-c", 'echo "$(POD_NAME) $TOKEN" > /work/prep.txt'],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "t"}}},
                    ],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                }
            ],
            "containers": [
                {
                    "name": "web",
                    "image": "kvsim",
                    "command": ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory", "/site"],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "site", "mountPath": "/site"}, {"name": "work", "mountPath": "/work"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "volumes": [{"name": "site", "configMap": {"name": "site"}}, {"name": "work", "emptyDir": {}}],
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template},
    }
    apply(ns, [config, secret, deployment])
    cluster.kubectl("wait", "-n", ns, "--for=condition=Available", "deployment/web", "--timeout=60s")
    ips = set()
    for pod in pods(ns, "app=web"):
        ip = pod["status"]["podIP"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(cluster.settings()["POD_CIDR"])
        with urllib.request.urlopen(f"http://{ip}:8000/index.html", timeout=5) as resp:
            assert resp.read() == b"hi\n"
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and "running" in status["state"]
        init = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
        assert init["exitCode"] == 0
        ips.add(ip)
    assert len(ips) == 2  # every pod has its own address, so two servers on port 8000 coexist
    logs = cluster.pod_log(ns, pods(ns, "app=web")[0]["metadata"]["name"], "web")
    assert "GET /index.html" in logs


def test_first_start_already_binds_the_pod_ip_and_sees_it_in_env(ns: str) -> None:
    """No init container to wait for: the very first process must get the pod IP (a replica bound to
    0.0.0.0 would take the port from every other replica)."""
    script = "import os, sys; print('POD_IP=' + os.environ['POD_IP'], flush=True); sys.exit(0)"
    pod = sim_pod(
        "first",
        ["python3", "-c", script, "--host", "0.0.0.0"],
        restartPolicy="Never",
        container={"env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]},
    )
    apply(ns, pod)
    wait_until("pod first Succeeded", lambda: get(ns, "pod", "first")["status"].get("phase") == "Succeeded")
    ip = get(ns, "pod", "first")["status"]["podIP"]
    log = cluster.pod_log(ns, "first", "main")
    first_start = next(line for line in log.splitlines() if line.startswith("--- "))
    assert first_start.endswith(f"--host {ip}")
    assert f"POD_IP={ip}" in log


def test_simulated_jobs_report_exit_codes_and_termination_messages(ns: str, tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    build = {
        "metadata": {"labels": dict(SIM)},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "build",
                    "image": "kvsim",
                    "command": ["sh", "-c", "mkdir -p /engines/fp && echo e > /engines/fp/rank0.engine && echo fp > /dev/termination-log"],
                    "volumeMounts": [{"name": "engines", "mountPath": "/engines"}],
                }
            ],
            "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": "engines"}}],
        },
    }
    broken = {
        "metadata": {"labels": dict(SIM)},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "build",
                    "image": "kvsim",
                    "command": ["python3", "-c", "import sys; print('ERROR: bad max_batch_size'); sys.exit(3)"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }
    flaky = {
        "metadata": {"labels": dict(SIM)},
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "flaky",
                    "image": "kvsim",
                    "command": ["sh", "-c", "[ -f /d/once ] && exit 0; touch /d/once; exit 1"],
                    "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                }
            ],
            "volumes": [{"name": "d", "emptyDir": {}}],
        },
    }
    try:
        apply(ns, [*engine_volume(ns, engines), job("build", build), job("broken", broken), job("flaky", flaky, backoff_limit=3)])
        wait_until("Job build Complete", lambda: get(ns, "job", "build")["status"].get("succeeded") == 1)
        assert (engines / "fp" / "rank0.engine").read_text() == "e\n"  # the PVC is the PV's hostPath
        assert terminated_of(pods(ns, "job-name=build")[0])["message"] == "fp\n"
        wait_until("Job broken Failed", lambda: get(ns, "job", "broken")["status"].get("failed") == 1)
        term = terminated_of(pods(ns, "job-name=broken")[0])
        assert (term["exitCode"], term["reason"]) == (3, "Error")
        assert "ERROR: bad max_batch_size" in term["message"]  # FallbackToLogsOnError
        wait_until("Job flaky Complete", lambda: get(ns, "job", "flaky")["status"].get("succeeded") == 1)
        status = pods(ns, "job-name=flaky")[0]["status"]["containerStatuses"][0]
        assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 1
    finally:
        cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)


def test_crash_loop_and_failed_liveness_restart_the_container(ns: str) -> None:
    crasher = sim_pod("crasher", ["sh", "-c", "echo bye; exit 2"])
    unlive = sim_pod(
        "unlive",
        ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"],
        terminationGracePeriodSeconds=2,
        container={"livenessProbe": {"httpGet": {"path": "/nope", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2}},
    )
    apply(ns, [crasher, unlive])

    def restarted(name: str, times: int) -> dict | None:
        status = (get(ns, "pod", name)["status"].get("containerStatuses") or [{}])[0]
        return status if status.get("restartCount", 0) >= times else None

    status = wait_until("crasher restarted twice", lambda: restarted("crasher", 2))
    assert status["lastState"]["terminated"]["exitCode"] == 2
    status = wait_until("unlive restarted by its liveness probe", lambda: restarted("unlive", 1), timeout_s=30)
    assert status["lastState"]["terminated"]["exitCode"] == 128 + 15  # stopped with SIGTERM


# Two servers-to-be: one cleans up on SIGTERM, one ignores it (so only SIGKILL after the grace period stops it).
POLITE = """
import os, signal, time
open('/out/polite.pid', 'w').write(str(os.getpid()))
signal.signal(signal.SIGTERM, lambda *a: (open('/out/polite.term', 'w').write('bye'), os._exit(0)))
time.sleep(600)
"""
STUBBORN = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open('/out/stubborn.pid', 'w').write(str(os.getpid()))
time.sleep(600)
"""


def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(ns: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    volume = {"volumes": [{"name": "out", "hostPath": {"path": str(out)}}]}
    mount = {"volumeMounts": [{"name": "out", "mountPath": "/out"}]}
    polite = sim_pod(
        "polite",
        ["python3", "-c", POLITE],
        container=mount,
        **volume,
    )
    stubborn = sim_pod(
        "stubborn",
        ["python3", "-c", STUBBORN],
        terminationGracePeriodSeconds=2,
        container=mount,
        **volume,
    )
    apply(ns, [polite, stubborn])
    for name in ("polite", "stubborn"):
        wait_until(f"{name} running", lambda n=name: (out / f"{n}.pid").exists())
    pids = {name: int((out / f"{name}.pid").read_text()) for name in ("polite", "stubborn")}
    start = time.monotonic()
    cluster.kubectl("delete", "-n", ns, "pod", "polite", "stubborn", "--wait=true", "--timeout=60s")
    took = time.monotonic() - start
    assert (out / "polite.term").read_text() == "bye"  # it got SIGTERM and could clean up
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), name
    print(f"graceful deletion of both pods took {took:.1f}s (stubborn one has a 2s grace period)")
    assert took >= 2.0  # the SIGTERM-ignoring pod was only killed after its grace period


def test_token_kubeconfig_carries_only_the_service_accounts_rights(ns: str, tmp_path: Path) -> None:
    cluster.kubectl("create", "serviceaccount", "op", "-n", ns)
    cluster.kubectl("create", "role", "read-pods", "-n", ns, "--verb=get,list", "--resource=pods")
    cluster.kubectl("create", "rolebinding", "op-read", "-n", ns, "--role=read-pods", f"--serviceaccount={ns}:op")
    kubeconfig = cluster.serviceaccount_kubeconfig(ns, "op", tmp_path / "op.kubeconfig")
    who = cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=kubeconfig)
    assert who == f"system:serviceaccount:{ns}:op"
    cluster.kubectl("get", "pods", "-n", ns, kubeconfig=kubeconfig)  # allowed by the role
    with pytest.raises(cluster.CommandError, match="forbidden"):
        cluster.kubectl("get", "secrets", "-n", ns, kubeconfig=kubeconfig)
