"""Cluster DNS for the pods the local kubelet runs: a hosts file of their stable network identities.

A StatefulSet pod (every LeaderWorkerSet leader and worker is one) has ``spec.hostname`` and
``spec.subdomain``; in a cluster, CoreDNS answers ``<hostname>.<subdomain>.<namespace>.svc.<zone>`` with its
IP once the headless Service ``<subdomain>`` exists, and the pod's search path makes
``<hostname>.<subdomain>.<namespace>`` resolve too. That is how a multi-node engine's leader finds its workers
(``LWS_LEADER_ADDRESS`` is ``<lws>-<group>.<subdomain>.<namespace>``). There is no DNS server here, and the
host's resolver cannot be changed, so the agent keeps those records in ``run/cluster-hosts`` (hosts(5)
format) and a ``getent`` shim on the pods' PATH answers ``getent hosts NAME`` from it first: the programs
that look names up (the leader's wait loop, the kvsim stand-ins) do it through getent. Simplification:
a record exists while the pod runs here, whether or not the headless Service does (LWS always creates it).

HostsTable is pure bookkeeping plus one atomic file write per change; getent_shim() is the shim's text.
"""

from __future__ import annotations

import os
import shlex
import threading
from pathlib import Path

CLUSTER_ZONE = "cluster.local"


def pod_names(pod: dict) -> list[str]:
    """The DNS names of a pod's stable identity, longest first; none without hostname and subdomain."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    hostname, subdomain, namespace = spec.get("hostname"), spec.get("subdomain"), meta.get("namespace")
    if not (hostname and subdomain and namespace):
        return []
    base = f"{hostname}.{subdomain}.{namespace}"
    return [f"{base}.svc.{CLUSTER_ZONE}", f"{base}.svc", base]


class HostsTable:
    """uid -> (ip, names), written to ``path`` after every change (a rename, so readers never see half)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: dict[str, tuple[str, list[str]]] = {}
        self._lock = threading.Lock()
        self._write()

    def add(self, uid: str, ip: str, pod: dict) -> None:
        names = pod_names(pod)
        if not names:
            return
        with self._lock:
            self._records[uid] = (ip, names)
            self._write()

    def remove(self, uid: str) -> None:
        with self._lock:
            if self._records.pop(uid, None) is not None:
                self._write()

    def text(self) -> str:
        lines = [f"{ip} {' '.join(names)}" for ip, names in sorted(self._records.values(), key=lambda r: r[1])]
        return "".join(line + "\n" for line in lines)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(self.text(), encoding="utf-8")
        os.replace(tmp, self.path)


def getent_shim(hosts_file: Path, real_getent: str | None) -> str:
    """A ``getent`` that answers ``hosts``/``ahosts``/``ahostsv4`` for one name from the cluster's hosts file
    (exit 0 with ``IP NAME``), and hands everything else to the host's getent (exit 2 if there is none)."""
    real = shlex.quote(real_getent) if real_getent else ""
    fallback = f'exec {real} "$@"' if real else 'exit 2'
    return f"""#!/bin/sh
# local kubelet shim: getent answers the cluster DNS names of the pods this kubelet runs (podagent/dns.py)
case "$1" in
  hosts|ahosts|ahostsv4)
    if [ "$#" -eq 2 ]; then
      line=$(awk -v n="$2" '{{ for (i = 2; i <= NF; i++) if ($i == n) {{ print $1 " " n; exit }} }}' {shlex.quote(str(hosts_file))})
      if [ -n "$line" ]; then echo "$line"; exit 0; fi
    fi ;;
esac
{fallback}
"""
