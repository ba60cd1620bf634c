"""The local kubelet's podman runner end to end: simulated pods run from the real kvsim image (`make images`)
with the pod's command, args, env, volumes, securityContext and probes, on the pod IP.

Skipped, saying why, where podman is absent, the image is not built, or LOCALKUBELET_RUNNER=process.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.testenv.test_kvsim_pods_e2e import KVSIM_BUILD
from tests.testenv.test_localcluster_e2e import SIM, apply, engine_volume, get, job, terminated_of, wait_until

import kvpilot

from hack.testenv import cluster
from hack.testenv.podagent.podman import image_present, podman_binary

pytestmark = pytest.mark.e2e

KVSIM_IMAGE = f"ghcr.io/kvpilot/kvsim:{kvpilot.__version__}"
# What the operator gives kvsim pods (desired/pod_parts.py), plus the chart-style hardening.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def podman() -> str:
    """The podman executable, when the kvsim image can run under it here."""
    if os.environ.get("LOCALKUBELET_RUNNER") == "process":
        pytest.skip("LOCALKUBELET_RUNNER=process: the local kubelet runs no images")
    binary = podman_binary()
    if binary is None:
        pytest.skip("podman/runc not installed: `make images` installs them and builds the images")
    if not image_present(binary, KVSIM_IMAGE):
        pytest.skip(f"{KVSIM_IMAGE} is not built: run `make images`")
    return binary


def container_id(pod: dict[str, Any]) -> str:
    """The first container's containerID (podman://<name> or process://<pgid>)."""
    return ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("containerID", "")


def test_a_job_runs_in_the_kvsim_image_as_its_user_with_env_volumes_and_a_read_only_root(
    podman: str, ns: str, tmp_path: Path
) -> None:
    probe = (
        'printf "uid=%s groups=%s greeting=%s config=%s" "$(id -u)" "$(id -G)" "$GREETING" "$(cat /config/greeting)"'
        " > /dev/termination-log; touch /engines/written && ! touch /usr/x 2>/dev/null && command -v trtllm-serve"
    )
    template = {
        "metadata": {"labels": dict(SIM)},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": POD_SECURITY,
            "containers": [{
                "name": "main", "image": KVSIM_IMAGE, "command": ["sh", "-c", probe],
                "env": [{"name": "GREETING", "value": "hello"}],
                "securityContext": CONTAINER_SECURITY,
                "volumeMounts": [{"name": "engines", "mountPath": "/engines"},
                                 {"name": "config", "mountPath": "/config", "readOnly": True}],
            }],
            "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": "engines"}},
                        {"name": "config", "configMap": {"name": "greeting"}}],
        },
    }
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "greeting"}, "data": {"greeting": "from-cm"}}
    try:
        apply(ns, [*engine_volume(ns, tmp_path / "engines"), config, job("probe", template)])
        wait_until("Job probe finished", lambda: (get(ns, "job", "probe")["status"].get("succeeded")
                                                   or get(ns, "job", "probe")["status"].get("failed")), 120)
        pod = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", "job-name=probe", "-o", "json"))["items"][0]
        term = terminated_of(pod)
        assert container_id(pod).startswith("podman://"), container_id(pod)
        assert term.get("exitCode") == 0, term
        assert term["message"] == "uid=10001 groups=10001 greeting=hello config=from-cm"
        assert (tmp_path / "engines" / "written").exists()  # fsGroup made the claim writable for uid 10001
    finally:
        cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)


def test_kvsim_serves_from_its_image_on_the_pod_ip_with_probes_and_stops_on_delete(
    podman: str, ns: str, tmp_path: Path
) -> None:
    build = json.loads(json.dumps(KVSIM_BUILD))
    for container in [*build["spec"]["initContainers"], *build["spec"]["containers"]]:
        container["image"] = KVSIM_IMAGE
    build["spec"]["securityContext"] = POD_SECURITY
    serve = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "serve", "labels": dict(SIM)},
        "spec": {
            "securityContext": POD_SECURITY,
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "trtllm-serve", "image": KVSIM_IMAGE, "command": ["trtllm-serve"],
                "args": ["/engines/fp", "--backend", "tensorrt", "--host", "0.0.0.0", "--port", "8000",
                         "--max_batch_size", "32"],
                "env": [{"name": "KVSIM_PROFILE", "value": "llama-3.1-8b-fp8-h100"}],
                "ports": [{"name": "http", "containerPort": 8000}],
                "securityContext": CONTAINER_SECURITY,
                "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                # An exec probe runs inside the container (podman exec), where the engine is mounted.
                "livenessProbe": {"exec": {"command": ["test", "-f", "/engines/fp/config.json"]}, "periodSeconds": 2},
                "volumeMounts": [{"name": "engines", "mountPath": "/engines"}, {"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": "engines"}},
                        {"name": "tmp", "emptyDir": {}}],
        },
    }
    try:
        apply(ns, [*engine_volume(ns, tmp_path / "engines"), job("build", build)])
        wait_until("Job build Complete", lambda: get(ns, "job", "build")["status"].get("succeeded") == 1, 180)
        apply(ns, serve)
        cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/serve", "--timeout=180s")
        pod = get(ns, "pod", "serve")
        cid = container_id(pod)
        assert cid.startswith("podman://"), cid
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0  # the exec liveness probe passes
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/health", timeout=5) as resp:
            assert resp.status == 200
        name = cid.removeprefix("podman://")
        user = subprocess.run([podman, "inspect", "--format", "{{.Config.User}}", name], capture_output=True, text=True)
        assert user.stdout.strip() == "10001:10001"
        cluster.kubectl("delete", "pod", "serve", "-n", ns, "--wait=true", "--timeout=60s")
        gone = subprocess.run([podman, "container", "exists", name], check=False)
        assert gone.returncode == 1, f"container {name} outlived its pod"
    finally:
        cluster.kubectl("delete", "pv", f"{ns}-engines", "--wait=false", check=False)
