"""Startup, readiness and liveness probes with the kubelet's timing and threshold semantics.

A probe runs first `initialDelaySeconds` after the container starts, then every `periodSeconds`;
`failureThreshold` consecutive failures flip it to failed, `successThreshold` consecutive successes
to passed. Readiness and liveness wait until the startup probe (if any) has passed. The HTTP probe
dials the pod IP, which is where the rewritten `--host 0.0.0.0` binds the server.
"""

from __future__ import annotations

import http.client
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger("localkubelet.probes")

STARTUP, READINESS, LIVENESS = "startupProbe", "readinessProbe", "livenessProbe"


@dataclass(frozen=True)
class ProbeContext:
    """Where and how a container's probes run."""

    pod_ip: str
    ports: Mapping[str, int]  # named container ports
    env: Mapping[str, str]
    cwd: str
    rewrite: Callable[[str], str]  # container path -> local path, for exec probes
    exec_prefix: tuple[str, ...] = ()  # `podman exec <name>` when the container is a real one
    exec_overhead_s: float = 0.0  # added to an exec probe's timeout: what `podman exec` itself takes


def _port(value: int | str, ctx: ProbeContext) -> int:
    """A probe port: a number, a numeric string, or the name of a container port."""
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    if value not in ctx.ports:
        raise ValueError(f"probe port {value!r} names no container port")
    return ctx.ports[value]


def run_probe(spec: Mapping, ctx: ProbeContext) -> tuple[bool, str]:
    """Run one probe attempt; returns (passed, message)."""
    timeout = float(spec.get("timeoutSeconds", 1))
    try:
        if "httpGet" in spec:
            get = spec["httpGet"]
            conn_cls = http.client.HTTPSConnection if get.get("scheme") == "HTTPS" else http.client.HTTPConnection
            conn = conn_cls(get.get("host") or ctx.pod_ip, _port(get["port"], ctx), timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                conn.request("GET", get.get("path", "/"), headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400, f"HTTP probe returned {status}"
        if "tcpSocket" in spec:
            tcp = spec["tcpSocket"]
            with socket.create_connection((tcp.get("host") or ctx.pod_ip, _port(tcp["port"], ctx)), timeout=timeout):
                return True, "TCP connect succeeded"
        if "exec" in spec:
            argv = [*ctx.exec_prefix, *(ctx.rewrite(a) for a in spec["exec"].get("command") or [])]
            done = subprocess.run(
                argv, cwd=ctx.cwd, env=dict(ctx.env), timeout=timeout + ctx.exec_overhead_s, capture_output=True,
                check=False,
            )
            return done.returncode == 0, f"exec probe exited {done.returncode}: {done.stdout[-200:]!r}"
    except (OSError, ValueError, subprocess.TimeoutExpired, http.client.HTTPException) as exc:
        return False, f"probe error: {exc}"
    log.warning("probe %s is not supported by the local kubelet; treating it as passing", sorted(spec))
    return True, "unsupported probe type treated as passing"


@dataclass
class ProbeTracker:
    """The state of one probe of one container run."""

    kind: str
    spec: Mapping
    next_at: float
    passed: bool
    successes: int = 0
    failures: int = 0
    message: str = ""
    history: list[bool] = field(default_factory=list)

    @classmethod
    def start(cls, kind: str, spec: Mapping, started_at: float) -> ProbeTracker:
        """A fresh tracker for a container run that started at `started_at` (monotonic seconds).
        Liveness starts out passing, readiness and startup start out failing, as in the kubelet."""
        return cls(
            kind=kind, spec=spec, next_at=started_at + float(spec.get("initialDelaySeconds", 0)), passed=kind == LIVENESS
        )

    def due(self, now: float) -> bool:
        """Whether the next attempt is due."""
        return now >= self.next_at

    def record(self, ok: bool, message: str, now: float) -> bool:
        """Account one attempt; returns True when this attempt made the probe cross its failure threshold."""
        self.next_at = now + float(self.spec.get("periodSeconds", 10))
        self.message = message
        self.history = [*self.history[-9:], ok]
        if ok:
            self.failures, self.successes = 0, self.successes + 1
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.passed = True
            return False
        self.successes, self.failures = 0, self.failures + 1
        threshold = int(self.spec.get("failureThreshold", 3))
        if self.failures >= threshold:
            self.passed = False
        return self.failures == threshold


def trackers_for(container: Mapping, started_at: float) -> dict[str, ProbeTracker]:
    """Trackers for every probe the container declares."""
    return {
        kind: ProbeTracker.start(kind, container[kind], started_at)
        for kind in (STARTUP, READINESS, LIVENESS)
        if container.get(kind)
    }


def now() -> float:
    """Monotonic clock used for all probe scheduling."""
    return time.monotonic()
