"""The operator as users run it: the chart's Deployment container, started from the real operator image
(ghcr.io/kvpilot/kvpilot, built by `make images`) under podman, against the local control plane.

What comes from the installed chart, read back from the API server: the image, command, args, env,
securityContext (uid 65532, read-only root filesystem, no capabilities, no privilege escalation) and the
/tmp emptyDir. Like a kubelet, it mounts a ServiceAccount token of the chart's ServiceAccount at
/var/run/secrets/kubernetes.io/serviceaccount and sets KUBERNETES_SERVICE_HOST/PORT, so the operator
logs in with its in-cluster config and gets exactly the chart's RBAC.

Changed for the test machine only: host networking (shared by several clusters, so --health-port and
--metrics-port get free ports) and --resync-seconds (shorter, so tests run faster). The container
translation is the local kubelet's own (hack/testenv/podagent/podman.py).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from hack.testenv import cluster
from hack.testenv.podagent.podman import image_present, plan_podman, podman_binary


SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEPLOYMENT = "kvpilot"


def override_flags(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with each `--flag value` in `values` replaced (or appended when absent)."""
    out, seen, i = [], set(), 0
    while i < len(args):
        if args[i] in values and i + 1 < len(args):
            out += [args[i], values[args[i]]]
            seen.add(args[i])
            i += 2
            continue
        out.append(args[i])
        i += 1
    for flag, value in values.items():
        if flag not in seen:
            out += [flag, value]
    return out


def free_port() -> int:
    """A port nothing listens on now (host networking: every cluster on this machine shares the ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chart_pod(namespace: str) -> dict[str, Any]:
    """The operator pod as the chart's Deployment would have the kubelet create it (a name and a uid added)."""
    deployment = json.loads(cluster.kubectl("get", "deployment", DEPLOYMENT, "-n", namespace, "-o", "json"))
    template = deployment["spec"]["template"]
    suffix = uuid.uuid4().hex[:5]
    return {
        "metadata": {**template.get("metadata", {}), "name": f"{DEPLOYMENT}-e2e-{suffix}", "namespace": namespace,
                     "uid": f"operator-{suffix}"},
        "spec": template["spec"],
        "status": {"podIP": "127.0.0.1", "hostIP": "127.0.0.1"},
    }


def available(image: str | None = None) -> str | None:
    """The podman executable when the operator image can run here, else None."""
    podman = podman_binary()
    if podman is None:
        return None
    return podman if image is None or image_present(podman, image) else None


class OperatorContainer:
    """Same interface as closedloop.OperatorProcess: start(), healthy(), kill(), stop(), logs()."""

    mode = "image"

    def __init__(self, logdir: Path, namespace: str, resync_seconds: float = 3.0, kvsim_image: str = ""):
        self.logdir, self.namespace = logdir, namespace
        self.resync_seconds, self.kvsim_image = resync_seconds, kvsim_image
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.extra_args: list[str] = []  # more `kvpilot run` flags, for the next start
        self.metrics = 0  # kept across restarts: Prometheus scrapes it through the chart's metrics Service
        self.name = ""
        self.image = ""
        podman = podman_binary()
        if podman is None:
            raise RuntimeError("podman and runc are needed to run the operator image (make images installs them)")
        self.podman = podman

    @property
    def log_path(self) -> Path:
        return self.logdir / f"operator-{self.starts}.log"

    def _service_account_dir(self) -> Path:
        """A projected-token directory like the kubelet's: token, ca.crt, namespace (readable by uid 65532)."""
        sa = self.logdir / f"serviceaccount-{self.starts}"
        sa.mkdir(parents=True, exist_ok=True)
        token = cluster.kubectl("create", "token", "kvpilot", "-n", self.namespace, "--duration=24h").strip()
        (sa / "token").write_text(token)
        shutil.copyfile(cluster.testenv_dir() / "pki" / "ca.crt", sa / "ca.crt")
        (sa / "namespace").write_text(self.namespace)
        for path in [sa, *sa.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        return sa

    def command(self) -> list[str]:
        """The `podman run` argv for the chart's operator container."""
        pod = chart_pod(self.namespace)
        container = dict(pod["spec"]["containers"][0])
        self.image = container["image"]
        self.health = free_port()
        self.metrics = self.metrics or free_port()
        overrides = {"--health-port": str(self.health), "--metrics-port": str(self.metrics),
                     "--resync-seconds": str(self.resync_seconds)}
        if self.kvsim_image:
            overrides["--kvsim-image"] = self.kvsim_image
        container["args"] = [*override_flags([str(a) for a in container.get("args") or []], overrides),
                             *self.extra_args]
        server = cluster.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").strip()
        host, port = server.removeprefix("https://").rsplit(":", 1)
        container["env"] = [*(container.get("env") or []), {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: list[tuple[str, str, bool]] = []
        for mount in container.get("volumeMounts") or []:
            if "emptyDir" not in volumes.get(mount["name"], {}):
                raise RuntimeError(f"the chart's operator mounts {mount['name']!r}, which is not an emptyDir")
            local = self.logdir / f"volume-{self.starts}-{mount['name']}"
            local.mkdir(parents=True, exist_ok=True)
            local.chmod(0o1777)
            mounts.append((mount["mountPath"], str(local), bool(mount.get("readOnly"))))
        mounts.append((SA_MOUNT, str(self._service_account_dir()), True))
        container["volumeMounts"] = []
        plan = plan_podman(container, pod, mounts, str(self.logdir / f"termination-{self.starts}"),
                           lambda kind, ns, name: None, self.podman, str(cluster.testenv_dir()))
        self.name = plan.name
        Path(plan.termination_log).write_bytes(b"")
        Path(plan.termination_log).chmod(0o666)
        return plan.argv

    def start(self) -> None:
        self.starts += 1
        argv = self.command()
        if not image_present(self.podman, self.image):
            raise RuntimeError(f"{self.image} is not in the local image store: run `make images`")
        self.proc = subprocess.Popen(argv, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the operator container's /healthz never answered:\n"
                                   + self.log_path.read_text()[-3000:])
            time.sleep(0.5)

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"operator container exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _podman(self, *args: str, timeout_s: float = 60) -> None:
        subprocess.run([self.podman, *args], capture_output=True, check=False, timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the operator (a crash), then remove what is left of the container."""
        if self.proc and self.proc.poll() is None:
            self._podman("kill", "--signal", "KILL", self.name)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._podman("rm", "-f", "--time", "0", self.name)

    def stop(self) -> None:
        """SIGTERM as the kubelet does on deletion (kopf finishes its handlers), then SIGKILL after 20 s."""
        if self.proc and self.proc.poll() is None:
            self._podman("stop", "--time", "20", self.name, timeout_s=60)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._podman("rm", "-f", "--time", "0", self.name)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logdir.glob("operator-*.log")))


def make_operator(logdir: Path, namespace: str, kvsim_image: str, operator_image: str) -> tuple[Any, str]:
    """The operator to test against, and what it is: the image under podman when it is built, else the local
    process (closedloop.OperatorProcess). KVPILOT_E2E_OPERATOR=auto (default) | image | process."""
    import os

    from hack import closedloop

    wanted = os.environ.get("KVPILOT_E2E_OPERATOR", "auto")
    if wanted not in ("auto", "image", "process"):
        raise ValueError(f"KVPILOT_E2E_OPERATOR={wanted!r}: must be auto, image or process")
    if wanted == "image" or (wanted == "auto" and available(operator_image)):
        return (OperatorContainer(logdir, namespace, kvsim_image=kvsim_image),
                f"image {operator_image} under podman (the chart's Deployment container)")
    why = "KVPILOT_E2E_OPERATOR=process" if wanted == "process" else "no podman or no operator image; `make images`"
    return closedloop.OperatorProcess(logdir), f"local process ({why})"
