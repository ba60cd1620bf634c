#!/usr/bin/env python3
"""Local kubelet for the kvpilot test cluster: runs pods labelled serving.kvpilot.io/backend=simulated,
once scheduled onto a (kwok) node, bound to their own 127.2.x.y pod IP.

Two runners (--runner, or LOCALKUBELET_RUNNER):
  podman   each container runs from its image in the local store (make images builds the kvsim image),
           under podman with host networking: the image's programs, user and filesystem, the pod's
           command/args/env/volumes/securityContext/probes. Nothing is pulled.
  process  each container's command runs on this host (fast; no podman needed): `trtllm-build` /
           `trtllm-serve` run as `kvsim trtllm-build` / `kvsim trtllm-serve` through shims first on PATH,
           followed by the venv's bin (python3, kvsim) and the host's PATH.
  auto     (default) podman for a container whose image is in the store when podman is installed, else process.
Which one ran shows in the log and in each containerStatus's containerID (podman://... or process://...).

Started by hack/testenv/cluster-up.sh (log: .testenv/logs/localkubelet.log, container output:
.testenv/logs/pods/<namespace>/<pod>/<container>.log). Needs the project venv (kubernetes client).

    .venv/bin/python -m hack.testenv.localkubelet --kubeconfig .testenv/kubeconfig --state-dir .testenv
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import stat
import sys
import threading
from pathlib import Path

from hack.testenv.podagent import SIMULATED_SELECTOR
from hack.testenv.podagent.agent import Agent
from hack.testenv.podagent.dns import HostsTable, getent_shim
from hack.testenv.podagent.kube import Kube
from hack.testenv.podagent.podman import podman_binary
from hack.testenv.podagent.config import AgentConfig

log = logging.getLogger("localkubelet")

DEFAULT_SHIMS = (
    "trtllm-build=kvsim trtllm-build", "trtllm-serve=kvsim trtllm-serve",
    # Multi-node engines (MPI over SSH): kvsim's stand-ins for the leader's mpirun and launcher and the workers'
    # sshd (simulator/kvsim/multinode.py).
    "mpirun=python -m kvsim.multinode mpirun", "trtllm-llmapi-launch=python -m kvsim.multinode trtllm-llmapi-launch",
    "sshd=python -m kvsim.multinode sshd",
)


def write_shims(shim_dir: Path, mappings: list[str], venv_bin: Path) -> dict[str, str]:
    """Create one executable shim per NAME=COMMAND mapping; COMMAND's first word is looked up in the
    venv's bin first. Returns name -> shim path."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    shims: dict[str, str] = {}
    for mapping in mappings:
        name, _, command = mapping.partition("=")
        if not name or not command:
            raise SystemExit(f"--shim {mapping!r}: must be NAME=COMMAND, e.g. trtllm-serve=kvsim trtllm-serve")
        program, *rest = command.split()
        if (venv_bin / program).exists():
            program = os.fspath(venv_bin / program)
        path = shim_dir / name
        words = " ".join(shlex.quote(w) for w in [program, *rest])
        path.write_text(f'#!/bin/sh\n# local kubelet shim: {name} -> {command}\nexec {words} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        shims[name] = os.fspath(path)
    return shims


def write_getent_shim(shim_dir: Path, hosts_file: Path) -> str:
    """The cluster-DNS ``getent`` (podagent/dns.py), falling back to the host's own."""
    path = shim_dir / "getent"
    host_path = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != str(shim_dir))
    path.write_text(getent_shim(hosts_file, shutil.which("getent", path=host_path)))
    path.chmod(0o755)
    return os.fspath(path)


def base_environment(shim_dir: Path, venv_bin: Path) -> dict[str, str]:
    """The environment every container starts from, before its own env: shims, then the venv, then
    the host's PATH; unbuffered Python so output (and FallbackToLogsOnError) is current."""
    host_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {
        "PATH": os.pathsep.join([os.fspath(shim_dir), os.fspath(venv_bin), host_path]),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONUNBUFFERED": "1",
    }
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path, help="the .testenv directory")
    parser.add_argument("--selector", default=SIMULATED_SELECTOR, help="label selector of the pods to run")
    parser.add_argument("--pod-cidr", default="127.2.0.0/16", help="loopback network for pod IPs")
    parser.add_argument("--shim", action="append", default=None, help="NAME=COMMAND, replaces the defaults")
    parser.add_argument("--backoff-initial", type=float, default=2.0, help="first CrashLoopBackOff delay (s)")
    parser.add_argument("--backoff-max", type=float, default=40.0, help="CrashLoopBackOff cap (s)")
    parser.add_argument("--runner", choices=("auto", "podman", "process"),
                        default=os.environ.get("LOCALKUBELET_RUNNER", "auto"),
                        help="how containers run: from their image under podman, as local processes, or auto")
    parser.add_argument("--log-level", default=os.environ.get("LOCALKUBELET_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the agent until SIGTERM/SIGINT, then stop every pod process it started."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    state_dir = args.state_dir.resolve()
    venv_bin = Path(sys.executable).parent
    shim_dir = state_dir / "run" / "shims"
    shims = write_shims(shim_dir, args.shim or list(DEFAULT_SHIMS), venv_bin)
    hosts = HostsTable(state_dir / "run" / "cluster-hosts")
    shims["getent"] = write_getent_shim(shim_dir, hosts.path)
    podman = podman_binary() if args.runner != "process" else None
    if args.runner == "podman" and podman is None:
        raise SystemExit("--runner podman: podman and runc must be installed (make images installs them)")
    log.info("runner: %s", f"podman ({podman}) for images in the local store, else process" if podman and args.runner == "auto"
             else f"podman ({podman})" if podman else "process (local processes, no images)")
    cfg = AgentConfig(
        state_dir=state_dir,
        base_env=base_environment(shim_dir, venv_bin),
        shims=shims,
        backoff_initial_s=args.backoff_initial,
        backoff_max_s=args.backoff_max,
        podman=podman,
        require_image=args.runner == "podman",
    )
    agent = Agent(Kube(args.kubeconfig), cfg, args.pod_cidr, args.selector, dns=hosts)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watcher = threading.Thread(target=agent.watch_forever, args=(stop,), name="watch", daemon=True)
    watcher.start()
    ready_file = state_dir / "run" / "localkubelet.ready"
    while not stop.is_set():
        if agent.synced.is_set() and not ready_file.exists():
            ready_file.write_text(str(os.getpid()))
            log.info("synced; running pods matching %s (pod IPs from %s)", args.selector, args.pod_cidr)
        stop.wait(0.5)
    log.info("stopping: terminating %d pod(s)", len(agent.workers))
    agent.shutdown()
    ready_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
