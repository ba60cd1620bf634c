"""How long the operator's child watches take to see a change after the API server comes back (issue 22).

    KVPILOT_TESTENV_DIR=/tmp/testenv-x .venv/bin/python -m hack.bench_watch_reconnect --scenario stop --seconds 90
    .venv/bin/python -m hack.bench_watch_reconnect --scenario half-open
    .venv/bin/python -m hack.bench_watch_reconnect --informer-file /tmp/old/informer.py ...   # another version

It runs real informers (``kvpilot.k8s.informer``, or the file given, for a before/after comparison) of
ConfigMaps and Pods in one namespace of the local cluster, under the admin kubeconfig, then:

* ``stop``: stops kube-apiserver (SIGTERM, as a crash or an upgrade would), waits ``--seconds``, starts it again
  with the same command line, and creates a ConfigMap as soon as ``/readyz`` answers. Reported: seconds from
  ``/readyz`` to the informer's delivering that ConfigMap (the watch is back and caught up).
* ``half-open``: the informers reach the API server through a TCP relay of this script's; after the informers
  are watching, the relay stops forwarding on every open connection in both directions, without closing them
  (a peer that vanished, a NAT entry dropped), while new connections work. A ConfigMap is created then.
  Reported: seconds until the informer delivers it, i.e. until it has noticed the dead stream and replaced it.
* ``idle``: nothing happens for ``--seconds``; reported: the list and watch requests the informers made meanwhile
  (counted at the client), the price of the shorter watches.

The API server stays up afterwards (restarted with its own command line, its pid recorded where
cluster-down.sh finds it). It measures; it asserts nothing. Figures depend on the machine's load: say so.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from hack.testenv import cluster
from kvpilot.k8s.cache import KIND_BY_NAME

NAMESPACE = "watch-reconnect"
KINDS = ("ConfigMap", "Pod")


def log(msg: str) -> None:
    print(f"[watch-reconnect {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def informer_module(path: str | None) -> ModuleType:
    if path is None:
        from kvpilot.k8s import informer
        return informer
    spec = importlib.util.spec_from_file_location("informer_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Seen:
    """When each object name was first delivered (by a list or an event), on the event loop's thread."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.changed = threading.Condition()

    def mark(self, names: list[str]) -> None:
        with self.changed:
            for name in names:
                self.at.setdefault(name, time.monotonic())
            self.changed.notify_all()

    def wait_for(self, name: str, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while name not in self.at:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return self.at[name]


class Relay:
    """A TCP relay to the API server whose open connections can be frozen (``blackhole``) while new ones pass."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.frozen: set[int] = set()  # connection numbers whose bytes are no longer forwarded
        self.count = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            downstream, _ = self.server.accept()
            with self.lock:
                self.count += 1
                number = self.count
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(number, src, dst), daemon=True).start()

    def _pump(self, number: int, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while number in self.frozen:  # hold the bytes forever: the peer hears nothing
                    time.sleep(3600)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if number not in self.frozen:
                for sock in (src, dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def blackhole(self) -> int:
        with self.lock:
            self.frozen.update(range(1, self.count + 1))
            return self.count


def api_client(port: int | None, requests: dict[str, int]) -> k8s_client.ApiClient:
    """The admin client (through the relay when ``port`` is given), counting its GETs by kind into ``requests``."""
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig_path()), client_configuration=configuration)
    if port is not None:
        configuration.host = f"https://127.0.0.1:{port}"
    client = k8s_client.ApiClient(configuration)
    call_api = client.call_api

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        what = "watch" if "watch=true" in url else "list"
        requests[what] = requests.get(what, 0) + 1
        return call_api(method, url, *args, **kwargs)

    client.call_api = counted  # type: ignore[method-assign]
    return client


def configmap(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": NAMESPACE,
                                    "labels": {"app.kubernetes.io/managed-by": "kvpilot"}}})


def apiserver_pid() -> int:
    pid = int((cluster.testenv_dir() / "pids" / "kube-apiserver.pid").read_text().strip())
    assert b"kube-apiserver" in Path(f"/proc/{pid}/cmdline").read_bytes(), "the recorded pid is not kube-apiserver"
    return pid


def ready() -> bool:
    try:
        return cluster.kubectl("get", "--raw=/readyz", timeout_s=5, check=False).strip() == "ok"
    except subprocess.TimeoutExpired:
        return False


def restart_apiserver_after(seconds: float) -> float:
    """Stop kube-apiserver, wait, start it again with its own command line; the monotonic time /readyz said ok."""
    pid = apiserver_pid()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGTERM)
    while Path(f"/proc/{pid}").exists() and b"Z" not in Path(f"/proc/{pid}/stat").read_bytes().split()[2]:
        time.sleep(0.1)
    log(f"kube-apiserver (pid {pid}) stopped; starting it again in {seconds:.0f}s")
    time.sleep(seconds)
    logfile = open(cluster.testenv_dir() / "logs" / "kube-apiserver.log", "ab")  # noqa: SIM115 — the child keeps it
    proc = subprocess.Popen([a.decode() for a in argv], stdout=logfile, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    (cluster.testenv_dir() / "pids" / "kube-apiserver.pid").write_text(f"{proc.pid}\n")
    while not ready():
        time.sleep(0.1)
    at = time.monotonic()
    log(f"kube-apiserver (pid {proc.pid}) ready")
    return at


def start_informers(module: ModuleType, client: k8s_client.ApiClient, loop: asyncio.AbstractEventLoop,
                    seen: Seen) -> list[Any]:
    informers = []
    for kind in KINDS:
        def on_list(_kind: str, items: list[dict[str, Any]]) -> None:
            seen.mark([i["metadata"]["name"] for i in items])

        def on_event(_kind: str, _type: str, obj: dict[str, Any]) -> None:
            seen.mark([obj["metadata"]["name"]])

        inf = module.Informer(client, KIND_BY_NAME[kind], NAMESPACE, loop, on_list, on_event)
        inf.start()
        informers.append(inf)
    return informers


def measure(args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    module = informer_module(args.informer_file)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    relay = Relay(int(cluster.settings()["API_PORT"])) if args.scenario == "half-open" else None
    seen = Seen()
    requests: dict[str, int] = {}
    informers = start_informers(module, api_client(relay.port if relay else None, requests), loop, seen)
    warm = f"warm-{int(time.time())}"
    cluster.kubectl("apply", "-f", "-", stdin=configmap(warm))
    assert seen.wait_for(warm, 60) is not None, "the informers never delivered the warm-up ConfigMap"
    time.sleep(args.settle)  # let the watches run a while, as they would in a long-lived operator
    probe = f"probe-{int(time.time())}"
    result: dict[str, Any] = {"scenario": args.scenario, "informer": args.informer_file or "kvpilot.k8s.informer"}
    if args.scenario == "idle":
        before = dict(requests)
        time.sleep(args.seconds)
        made = {what: requests.get(what, 0) - before.get(what, 0) for what in ("list", "watch")}
        result.update(idle_s=args.seconds, informers=len(informers), requests=made,
                      per_informer_per_minute=round(sum(made.values()) * 60 / args.seconds / len(informers), 2))
    elif args.scenario == "stop":
        back = restart_apiserver_after(args.seconds)
        cluster.kubectl("apply", "-f", "-", stdin=configmap(probe))
        created = time.monotonic()
        at = seen.wait_for(probe, args.timeout)
        result.update(stopped_s=args.seconds, create_after_ready_s=round(created - back, 2),
                      seen_after_ready_s=None if at is None else round(at - back, 2))
    else:
        assert relay is not None
        frozen = relay.blackhole()
        start = time.monotonic()
        cluster.kubectl("apply", "-f", "-", stdin=configmap(probe))
        at = seen.wait_for(probe, args.timeout)
        result.update(frozen_connections=frozen, settle_s=args.settle,
                      seen_after_freeze_s=None if at is None else round(at - start, 2))
    for inf in informers:
        inf.stop()
    cluster.kubectl("delete", "configmap", warm, probe, "-n", NAMESPACE, "--ignore-not-found", check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--scenario", choices=("stop", "half-open", "idle"), default="stop")
    parser.add_argument("--seconds", type=float, default=90,
                        help="how long kube-apiserver stays stopped (stop), or the idle time measured (idle)")
    parser.add_argument("--settle", type=float, default=20,
                        help="seconds the watches run before the fault (default 20)")
    parser.add_argument("--timeout", type=float, default=400, help="give up waiting after this many seconds")
    parser.add_argument("--informer-file", help="an informer.py to measure instead of kvpilot.k8s.informer")
    args = parser.parse_args()
    cluster.ensure_cluster_up()

    async def run() -> dict[str, Any]:
        return await asyncio.to_thread(measure, args, asyncio.get_running_loop())

    print(json.dumps(asyncio.run(run())))
    os._exit(0)  # the informers' threads (and a frozen relay's) are daemons blocked in reads: do not wait


if __name__ == "__main__":
    main()
