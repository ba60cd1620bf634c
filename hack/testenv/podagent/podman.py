"""The podman runner: one container run of a pod as a real container from the image in the local store.

The process runner (process.py, podspec.plan_launch) runs a container's command on this host with paths
rewritten; this one runs the image itself, so what a pod gets is what a kubelet would start: the image's
entrypoint, user, filesystem and installed programs, with the pod's command/args, env, volumes (bind
mounts of the directories volumes.py materialises), securityContext and termination-message file.

Network: the host's (`--network host`), as every pod here shares the loopback; a container owns only its
pod IP, so `0.0.0.0` in its argv and env is rewritten to that IP exactly as in process mode.
Machine quirks (hack/images/lib.sh, local-control-plane.md §10): runc rather than crun (hybrid cgroups),
and rlimits lowered explicitly because without CAP_SYS_RESOURCE podman's defaults fail with EPERM.

plan_podman() is pure (unit-tested); PodmanRun is the I/O around it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .podspec import ConfigError, Lookup, LaunchPlan, bind_to_pod_ip, expand_vars, resolve_env
from .process import ContainerRun

log = logging.getLogger("localkubelet.podman")

RUNTIME = os.environ.get("KVPILOT_OCI_RUNTIME", "/usr/sbin/runc")
ULIMITS = ("nofile=4096:4096", "nproc=4096:4096")
CONTAINER_PREFIX = "kvpilot-pod-"
OWNER_LABEL = "io.kvpilot.testenv"  # the state dir of the cluster whose kubelet started it (cluster-down.sh)


def podman_binary() -> str | None:
    """The podman executable when containers can run here (podman and runc both installed), else None."""
    podman = shutil.which("podman")
    return podman if podman and os.access(RUNTIME, os.X_OK) else None


def image_present(podman: str, image: str) -> bool:
    """Whether `image` is in the local store (nothing is ever pulled: no registry is reachable)."""
    return subprocess.run([podman, "image", "exists", image], capture_output=True, check=False).returncode == 0


def container_name(pod: Mapping, container: str) -> str:
    """A podman container name unique per pod UID and container (clusters share one podman store)."""
    return f"{CONTAINER_PREFIX}{pod['metadata']['uid']}-{container}"[:120]


def security_flags(container: Mapping, pod: Mapping) -> list[str]:
    """podman flags for the pod's and container's securityContext (the fields the kubelet maps to the
    runtime: user, groups, read-only root, capabilities, no_new_privs)."""
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    sc = container.get("securityContext") or {}
    flags: list[str] = []
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and uid == 0:
        raise ConfigError(f"container {container.get('name')!r}: runAsNonRoot is set but runAsUser is 0")
    if uid is not None:
        flags += ["--user", f"{int(uid)}:{int(gid if gid is not None else uid)}"]
    elif gid is not None:
        raise ConfigError(f"container {container.get('name')!r}: runAsGroup without runAsUser is not supported here")
    for group in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])]:
        if group is not None:
            flags += ["--group-add", str(int(group))]
    if sc.get("readOnlyRootFilesystem"):  # without podman's extra tmpfs on /tmp, /var/tmp, /run: as a kubelet
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    caps = sc.get("capabilities") or {}
    flags += [f"--cap-drop={c}" for c in caps.get("drop") or []]
    flags += [f"--cap-add={c}" for c in caps.get("add") or []]
    return flags


@dataclass(frozen=True)
class PodmanPlan:
    """A `podman run` invocation plus what the worker needs around it."""

    argv: list[str]
    name: str
    env: dict[str, str]  # the container's own environment (for the record; podman gets it as -e)
    termination_log: str  # host file bind-mounted at the container's terminationMessagePath


def plan_podman(
    container: Mapping,
    pod: Mapping,
    mounts: Sequence[tuple[str, str, bool]],
    termination_log: str,
    lookup: Lookup,
    podman: str = "podman",
    owner: str = "",
) -> PodmanPlan:
    """Translate one container into `podman run`. `mounts` are (container path, local path, read-only)."""
    pod_ip = (pod.get("status") or {}).get("podIP", "")
    name = container_name(pod, container["name"])
    env = {k: bind_to_pod_ip(v, pod_ip) if pod_ip else v for k, v in resolve_env(container, pod, lookup).items()}
    command = [expand_vars(str(a), env) for a in container.get("command") or []]
    args = [expand_vars(str(a), env) for a in container.get("args") or []]
    if pod_ip:
        command, args = [bind_to_pod_ip(a, pod_ip) for a in command], [bind_to_pod_ip(a, pod_ip) for a in args]
    term_path = container.get("terminationMessagePath") or "/dev/termination-log"
    argv = [
        podman, "--runtime", RUNTIME, "run", "--rm", "--name", name, "--pull", "never",
        "--network", "host", "--hostname", pod["metadata"]["name"], "--log-driver", "none",
        "--label", f"{OWNER_LABEL}={owner}",
        *[f"--ulimit={u}" for u in ULIMITS],
        *security_flags(container, pod),
        "--volume", f"{termination_log}:{term_path}:rw",
    ]
    for path, local, read_only in mounts:
        argv += ["--volume", f"{local}:{path}:{'ro' if read_only else 'rw'}"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        argv += ["--workdir", str(container["workingDir"])]
    if command:  # Kubernetes' command replaces the image's ENTRYPOINT and drops its CMD
        argv += ["--entrypoint", json.dumps(command[:1])]
        args = command[1:] + args
    argv += [str(container.get("image", "")), *args]
    return PodmanPlan(argv=argv, name=name, env=env, termination_log=termination_log)


class PodmanRun(ContainerRun):
    """A `podman run` in the foreground: its exit code is the container's, its output the container's.

    Signals go to the container through `podman kill` (podman's own signal proxying starts late), and
    every stop ends with `podman rm -f`, because killing the podman client leaves the container running.
    """

    def __init__(self, plan: PodmanPlan, log_path: Path, pgid_file: Path, cwd: Path) -> None:
        self.podman_plan = plan
        self.podman = plan.argv[0]
        term = Path(plan.termination_log)
        term.parent.mkdir(parents=True, exist_ok=True)
        term.write_bytes(b"")
        term.chmod(0o666)  # the container's non-root user writes it
        subprocess.run([self.podman, "rm", "-f", "--time", "0", plan.name], capture_output=True, check=False)
        launch = LaunchPlan(argv=plan.argv, env=dict(os.environ), cwd=os.fspath(cwd), termination_log=plan.termination_log)
        super().__init__(launch, log_path, pgid_file)

    def _reset_termination_log(self) -> None:
        """The file already exists (it is a bind-mount source); only truncate it for this run."""
        Path(self.plan.termination_log).write_bytes(b"")

    def signal(self, sig: int) -> None:
        """Deliver `sig` to the container's init process."""
        subprocess.run([self.podman, "kill", "--signal", str(int(sig)), self.podman_plan.name],
                       capture_output=True, check=False, timeout=30)

    def _reap_group(self) -> None:
        """Remove the container (a no-op once `--rm` did), then kill the podman client's own group."""
        subprocess.run([self.podman, "rm", "-f", "--time", "0", self.podman_plan.name],
                       capture_output=True, check=False, timeout=60)
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.pgid_file.unlink(missing_ok=True)


def mount_modes(container: Mapping, mounts: Sequence[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    """container_mounts() pairs with each volumeMount's readOnly flag (same order as volumeMounts)."""
    flags = [bool(m.get("readOnly")) for m in container.get("volumeMounts") or []]
    return [(path, local, read_only) for (path, local), read_only in zip(mounts, flags, strict=True)]


WRITABLE_VOLUME_TYPES = ("emptyDir", "persistentVolumeClaim")
PROJECTED_VOLUME_TYPES = ("configMap", "secret", "downwardAPI", "projected")


def apply_fs_group(pod: Mapping, volume_paths: Mapping[str, Path]) -> None:
    """The kubelet's fsGroup ownership management: volumes that support it (not hostPath) become group-owned
    by fsGroup, group-writable and setgid, so a non-root container user can write its engine cache.
    Every claim is treated as supporting it, as most CSI drivers do."""
    spec = pod.get("spec") or {}
    group = (spec.get("securityContext") or {}).get("fsGroup")
    if group is None:
        return
    gid = int(group)
    for volume in spec.get("volumes") or []:
        path = volume_paths.get(volume["name"])
        writable = any(k in volume for k in WRITABLE_VOLUME_TYPES)
        if path is None or not path.is_dir() or not (writable or any(k in volume for k in PROJECTED_VOLUME_TYPES)):
            continue
        dir_bits, file_bits = (0o2070, 0o060) if writable else (0o050, 0o040)  # projected files stay read-only
        for root, dirs, files in os.walk(path):
            os.chown(root, -1, gid)
            os.chmod(root, os.stat(root).st_mode | dir_bits)
            for name in files:
                file = os.path.join(root, name)
                if not os.path.islink(file):
                    os.chown(file, -1, gid)
                    os.chmod(file, os.stat(file).st_mode | file_bits)
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
