"""The agent: list+watch simulated pods, give each bound pod a loopback IP and a worker thread.

The watch resumes from the last resourceVersion it saw; on 410 Gone (or any broken stream) it lists
again and reconciles: new pods get workers, vanished pods get their processes stopped. So a restarted
API server or a compacted etcd never leaves a pod unmanaged or a process orphaned.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time

from . import SIMULATED_SELECTOR
from .dns import HostsTable
from .kube import Kube, WatchExpired
from .config import AgentConfig
from .worker import PodWorker

log = logging.getLogger("localkubelet.agent")

WATCH_TIMEOUT_S = 240


class IPAllocator:
    """Unique pod IPs from a loopback network (Linux routes all of 127.0.0.0/8 to `lo`, so any of them
    can be bound without configuration). Hands them out round-robin so a freed IP is reused late."""

    def __init__(self, cidr: str) -> None:
        self.network = ipaddress.ip_network(cidr)
        self.owner: dict[str, str] = {}
        self._cursor = 0

    def claim(self, uid: str, wanted: str | None) -> str:
        """Keep `wanted` (a pod's existing IP, after an agent restart) if it is ours and free, else allocate."""
        if wanted and ipaddress.ip_address(wanted) in self.network and self.owner.get(wanted) in (None, uid):
            self.owner[wanted] = uid
            return wanted
        size = self.network.num_addresses
        for _ in range(size):
            self._cursor = self._cursor % (size - 2) + 1  # skip the network and broadcast addresses
            candidate = str(self.network.network_address + self._cursor)
            if candidate not in self.owner:
                self.owner[candidate] = uid
                return candidate
        raise RuntimeError(f"pod network {self.network} is exhausted")

    def release(self, uid: str) -> None:
        """Free every IP held by `uid`."""
        for ip in [ip for ip, owner in self.owner.items() if owner == uid]:
            del self.owner[ip]


class Agent:
    """Keeps one PodWorker per live, scheduled, non-terminal simulated pod."""

    def __init__(self, kube: Kube, cfg: AgentConfig, pod_cidr: str, selector: str = SIMULATED_SELECTOR,
                 dns: HostsTable | None = None) -> None:
        self.kube, self.cfg, self.selector, self.dns = kube, cfg, selector, dns
        self.ips = IPAllocator(pod_cidr)
        self.workers: dict[str, PodWorker] = {}
        self.node_ips: dict[str, str] = {}
        self.synced = threading.Event()
        self._lock = threading.Lock()  # the watch thread and shutdown() both touch self.workers
        self._closed = False

    def _node_ip(self, node_name: str) -> str:
        """The node's InternalIP (the pod's hostIP); 127.0.0.1 when the node does not say."""
        if node_name not in self.node_ips:
            node = self.kube.get("Node", "", node_name) or {}
            addresses = (node.get("status") or {}).get("addresses") or []
            internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
            self.node_ips[node_name] = internal[0] if internal else "127.0.0.1"
        return self.node_ips[node_name]

    def handle(self, event_type: str, pod: dict) -> None:
        """Apply one watch event (or one listed pod, as ADDED)."""
        with self._lock:
            if not self._closed:
                self._handle(event_type, pod)

    def _handle(self, event_type: str, pod: dict) -> None:
        """handle() under the lock."""
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        uid = meta["uid"]
        worker = self.workers.get(uid)
        if event_type == "DELETED":
            self._forget(uid, "deleted")
            return
        if worker is not None:
            if worker.is_alive():
                worker.update(pod)
                return
            self._forget(uid, "worker finished")
        if not spec.get("nodeName"):
            return  # not scheduled yet; the binding arrives as MODIFIED
        if meta.get("deletionTimestamp"):  # nothing of it runs (any more): finish the deletion
            if status.get("phase") not in ("Succeeded", "Failed"):  # terminal first, so Jobs account it
                self.kube.patch_pod_status(meta["namespace"], meta["name"], uid, {"phase": "Failed"})
            self.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        pod_ip = self.ips.claim(uid, status.get("podIP"))
        worker = PodWorker(pod, pod_ip, self._node_ip(spec["nodeName"]), self.cfg, self.kube)
        self.workers[uid] = worker
        if self.dns is not None:
            self.dns.add(uid, pod_ip, pod)
        log.info("%s/%s: bound to %s, pod IP %s", meta["namespace"], meta["name"], spec["nodeName"], pod_ip)
        worker.start()

    def _forget(self, uid: str, why: str) -> None:
        """Stop a pod's worker (killing its processes) and free its IP."""
        worker = self.workers.pop(uid, None)
        if worker is not None:
            log.info("%s: %s; stopping its worker", worker.key, why)
            worker.shutdown()
        if self.dns is not None:
            self.dns.remove(uid)
        self.ips.release(uid)

    def _relist(self) -> str:
        """List, reconcile against the workers we have, return the resourceVersion to watch from."""
        pods, resource_version = self.kube.list_pods(self.selector)
        seen = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            for uid in [u for u in self.workers if u not in seen]:
                self._forget(uid, "gone after relist")
            for pod in pods:  # existing IPs first, so an agent restart keeps every pod's address
                if (pod.get("status") or {}).get("podIP"):
                    self.ips.claim(pod["metadata"]["uid"], pod["status"]["podIP"])
        for pod in pods:
            self.handle("ADDED", pod)
        return resource_version

    def watch_forever(self, stop: threading.Event) -> None:
        """The list+watch loop; runs until `stop` is set."""
        resource_version = ""
        while not stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._relist()
                    self.synced.set()
                for event_type, obj in self.kube.watch_pods(self.selector, resource_version, WATCH_TIMEOUT_S):
                    if stop.is_set():
                        return
                    resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                    if event_type != "BOOKMARK":
                        self.handle(event_type, obj)
            except WatchExpired as exc:
                log.info("watch expired (%s); listing again", exc)
                resource_version = ""
            except Exception:
                log.exception("watch failed; listing again in 2s")
                resource_version = ""
                stop.wait(2)

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """Stop every worker and wait for their processes to be gone."""
        with self._lock:
            self._closed = True
            workers = list(self.workers.values())
        for worker in workers:
            worker.shutdown()
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        self.workers.clear()
