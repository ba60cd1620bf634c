"""Stand-ins for what a multi-node TensorRT-LLM engine runs besides trtllm-serve: ``sshd``, ``mpirun`` and
``trtllm-llmapi-launch`` (``python -m kvsim.multinode sshd|mpirun|trtllm-llmapi-launch ARGS``).

A LeaderWorkerSet group of N pods serves one engine whose TP x PP ranks span N nodes. TensorRT-LLM launches
it with MPI: every rank runs ``trtllm-llmapi-launch trtllm-serve ...`` (TensorRT-LLM's "Multi-node Serving"
docs, docs/source/commands/trtllm-serve/trtllm-serve.rst; the launcher runs the server on rank 0 and
``mgmn_worker_node`` on the others, tensorrt_llm/llmapi/trtllm-llmapi-launch). With Open MPI's ``mpirun``
the leader reaches the other nodes over SSH, so workers run ``sshd``. kvsim simulates the whole engine in
one process, so here:

- ``sshd`` listens where sshd would (``-p``, ``-o ListenAddress=``), refuses to start without a host key,
  and holds a connection per launch from ``mpirun``, admitting only a public key in its authorized keys.
  It speaks a one-line protocol of its own, not SSH (its banner says so): only these stand-ins talk to it.
- ``mpirun`` reads the hostfile (or ``-H``), needs ``-n`` ranks to fit the slots, reaches every remote host
  on the ``plm_rsh_args`` port with the ``-i`` key, starts rank 0 locally with Open MPI's environment
  (``OMPI_COMM_WORLD_RANK``/``_SIZE``, ``-x`` variables), and aborts the job, as ORTE does when a daemon is
  lost, the moment a worker's connection drops: the leader's container then exits and the LeaderWorkerSet
  recreates the group.
- ``trtllm-llmapi-launch`` on rank 0 checks the MPI world equals trtllm-serve's ``tp_size x pp_size`` (the
  engine's mapping needs it), strips the MPI environment as the real launcher does, and runs the command.

Host names are looked up with ``getent hosts`` (the local kubelet's cluster DNS answers it) before the
system resolver.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .sshd import err, sshd

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
MPI_ENV_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "MPI_", "UCX_")


def resolve(host: str) -> str:
    """An IPv4 address for ``host``: ``getent hosts`` first (cluster DNS here), then the resolver."""
    try:
        out = subprocess.run(["getent", "hosts", host], capture_output=True, text=True, timeout=5, check=False)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return socket.gethostbyname(host)


# ---------------------------------------------------------------- mpirun
@dataclass
class MpirunOptions:
    ranks: int = 0
    hosts: list[tuple[str, int]] = field(default_factory=list)  # (host, slots)
    mca: dict[str, str] = field(default_factory=dict)
    export: dict[str, str] = field(default_factory=dict)
    oversubscribe: bool = False
    command: list[str] = field(default_factory=list)


MPIRUN_FLAGS = {"--allow-run-as-root", "--oversubscribe", "--report-bindings", "--tag-output", "--display-map",
                "-v", "--verbose", "-q", "--quiet"}
MPIRUN_WITH_ARG = {"-n", "-np", "--np", "-c", "--hostfile", "-hostfile", "--machinefile", "-H", "--host", "-x",
                   "--bind-to", "--map-by", "--rank-by", "-wdir", "--wdir"}


def read_hostfile(path: str) -> list[tuple[str, int]]:
    hosts = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = next((int(w.split("=", 1)[1]) for w in words[1:] if w.startswith("slots=")), 1)
        hosts.append((words[0], slots))
    return hosts


def _host_list(value: str) -> list[tuple[str, int]]:
    out = []
    for item in value.split(","):
        host, _, slots = item.partition(":")
        out.append((host, int(slots or 1)))
    return out


def parse_mpirun(argv: list[str]) -> MpirunOptions:
    opts, i = MpirunOptions(), 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg in MPIRUN_FLAGS:
            opts.oversubscribe |= arg == "--oversubscribe"
            i += 1
        elif arg in ("--mca", "-mca", "--gmca"):
            if i + 2 >= len(argv):
                raise ValueError(f"{arg} needs a name and a value")
            opts.mca[argv[i + 1]] = argv[i + 2]
            i += 3
        elif arg in MPIRUN_WITH_ARG:
            if i + 1 >= len(argv):
                raise ValueError(f"option {arg} needs an argument")
            value = argv[i + 1]
            if arg in ("-n", "-np", "--np", "-c"):
                opts.ranks = int(value)
            elif arg in ("--hostfile", "-hostfile", "--machinefile"):
                opts.hosts += read_hostfile(value)
            elif arg in ("-H", "--host"):
                opts.hosts += _host_list(value)
            elif arg == "-x":
                name, sep, val = value.partition("=")
                opts.export[name] = val if sep else os.environ.get(name, "")
            i += 2
        else:
            raise ValueError(f"unknown option {arg!r}")
    opts.command = argv[i:]
    if not opts.command:
        raise ValueError("no program to run was given")
    if not opts.hosts:
        opts.hosts = [("localhost", max(1, opts.ranks))]
    if opts.ranks <= 0:
        opts.ranks = sum(s for _, s in opts.hosts)
    return opts


def rank_ranges(hosts: list[tuple[str, int]], ranks: int, oversubscribe: bool) -> list[tuple[str, int, int]]:
    """(host, first rank, rank count) by slot, host after host, as ``--map-by slot`` places them."""
    slots = sum(s for _, s in hosts)
    if ranks > slots and not oversubscribe:
        raise ValueError(f"There are not enough slots available in the system to satisfy the {ranks} slots "
                         f"that were requested by the application ({slots} slots in {len(hosts)} host(s))")
    out, first = [], 0
    for host, count in hosts:
        take = min(count, ranks - first)
        if take > 0:
            out.append((host, first, take))
            first += take
    return out


@dataclass
class RshArgs:
    port: int = 22
    identity: str | None = None
    attempts: int = 1


def parse_rsh_args(text: str) -> RshArgs:
    words, out, i = shlex.split(text), RshArgs(), 0
    while i < len(words):
        if words[i] == "-p" and i + 1 < len(words):
            out.port, i = int(words[i + 1]), i + 2
        elif words[i] == "-i" and i + 1 < len(words):
            out.identity, i = words[i + 1], i + 2
        elif words[i] == "-o" and i + 1 < len(words):
            key, _, value = words[i + 1].partition("=")
            if key.lower() == "connectionattempts":
                out.attempts = max(1, int(value))
            i += 2
        else:
            i += 1
    return out


def _public_key(identity: str | None) -> str:
    """The launch's key, as ssh would present it: the identity must exist and be private to its owner."""
    if not identity:
        raise ValueError("no identity: plm_rsh_args must give -i <private key>")
    mode = os.stat(identity).st_mode
    if mode & 0o077:
        raise ValueError(f"UNPROTECTED PRIVATE KEY FILE! Permissions {oct(mode & 0o777)} for '{identity}' are too open")
    pub = Path(identity + ".pub")
    return " ".join(pub.read_text(encoding="utf-8").split()[:2])


def connect_worker(host: str, first: int, count: int, world: int, rsh: RshArgs, pubkey: str) -> socket.socket:
    """A launch on ``host``: its sshd stand-in must answer on the rsh port and admit our key."""
    last: Exception | None = None
    for attempt in range(rsh.attempts):
        try:
            sock = socket.create_connection((resolve(host), rsh.port), timeout=10)
            stream = sock.makefile("rb")
            banner = stream.readline()
            sock.sendall(f"KVSIM-MPI {pubkey}\nranks {first}-{first + count - 1} of {world}\n".encode())
            answer = stream.readline().decode(errors="replace").strip()
            if answer != "OK":
                sock.close()
                raise PermissionError(f"{host}: {answer.removeprefix('DENIED ') or 'connection closed'} "
                                      f"(banner {banner.decode(errors='replace').strip()!r})")
            sock.settimeout(None)
            return sock
        except PermissionError:
            raise
        except OSError as exc:
            last = exc
            if attempt + 1 < rsh.attempts:
                time.sleep(1)
    raise ConnectionError(f"ssh: connect to host {host} port {rsh.port}: {last}")


def _watch(sock: socket.socket, host: str, lost: threading.Event, who: list[str]) -> None:
    try:
        while sock.recv(64):
            pass
    except OSError:
        pass
    who.append(host)
    lost.set()


def _stop(child: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
    return child.wait()


def mpirun(argv: list[str]) -> int:
    try:
        opts = parse_mpirun(argv)
        placement = rank_ranges(opts.hosts, opts.ranks, opts.oversubscribe)
        rsh = parse_rsh_args(opts.mca.get("plm_rsh_args", ""))
        remote = [(h, f, n) for h, f, n in placement if h not in LOCAL_NAMES]
        pubkey = _public_key(rsh.identity) if remote else ""
    except (ValueError, OSError) as exc:
        err("mpirun", str(exc))
        return 1
    if placement[0][0] not in LOCAL_NAMES:
        err("mpirun", f"rank 0 must run on this node (the first host is {placement[0][0]!r}, not localhost)")
        return 1
    lost, who, socks = threading.Event(), list[str](), list[socket.socket]()
    try:
        for host, first, count in remote:
            socks.append(connect_worker(host, first, count, opts.ranks, rsh, pubkey))
            threading.Thread(target=_watch, args=(socks[-1], host, lost, who), daemon=True).start()
    except (OSError, ValueError) as exc:
        err("mpirun", f"{exc}\nORTE was unable to reliably start one or more daemons.")
        return 1
    print(f"kvsim mpirun: {opts.ranks} ranks on {len(placement)} node(s): "
          + ", ".join(f"{h} {f}-{f + n - 1}" for h, f, n in placement), flush=True)
    env = {**os.environ, **opts.export, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(opts.ranks),
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": str(placement[0][2])}
    child = subprocess.Popen(opts.command, env=env)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    while child.poll() is None and not lost.wait(0.2):
        pass
    if child.poll() is None:
        err("mpirun", f"ORTE has lost communication with a remote daemon on {who[0]}: the job aborts")
        _stop(child)
        return 1
    for sock in socks:
        sock.close()
    return child.returncode


# ---------------------------------------------------------------- trtllm-llmapi-launch
def _flag(argv: list[str], names: tuple[str, ...], default: int) -> int:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return int(argv[i + 1])
            if arg.startswith(name + "="):
                return int(arg.split("=", 1)[1])
    return default


def llmapi_launch(argv: list[str]) -> int:
    if not argv:
        err("trtllm-llmapi-launch", "no command given")
        return 1
    rank = int(os.environ.get("SLURM_PROCID") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    world = int(os.environ.get("SLURM_NTASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    if rank != 0:  # mgmn_worker_node: the simulated engine lives whole on rank 0
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        return 0
    tp = _flag(argv, ("--tp_size", "--tensor_parallel_size"), 1)
    pp = _flag(argv, ("--pp_size", "--pipeline_parallel_size"), 1)
    if tp * pp != world:
        err("trtllm-llmapi-launch", f"MPI world size {world} != tp_size {tp} x pp_size {pp}: the engine's mapping "
             "needs one rank per GPU (mpirun -n must be tp_size x pp_size)")
        return 1
    env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_ENV_PREFIXES)}
    env["tllm_mpi_size"] = str(world)
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


COMMANDS = {"sshd": sshd, "mpirun": mpirun, "trtllm-llmapi-launch": llmapi_launch}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(__doc__.split("\n\n")[0] + f"\n\nusage: python -m kvsim.multinode {{{','.join(COMMANDS)}}} ARGS...",
              file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
