"""The operator as the scale benchmark runs it (hack/bench_scale.py): a local process under the chart's ServiceAccount,
its metrics port open, with what the benchmark reads from it: peak RSS and CPU from /proc, and its own counters
of API requests and reconciles."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hack import closedloop
from hack.testenv import cluster

ROOT = Path(__file__).resolve().parent.parent


class Operator:
    """The operator as a local process under the chart's ServiceAccount, with its metrics port open."""

    def __init__(self, logdir: Path, resync: float):
        self.logdir, self.resync = logdir, resync
        self.kubeconfig = cluster.serviceaccount_kubeconfig(closedloop.OPERATOR_NS, "kvpilot", logdir / "sa.kubeconfig")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.metrics, health = closedloop.free_port(), closedloop.free_port()
        # MALLOC_ARENA_MAX as the chart's Deployment sets it.
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", MALLOC_ARENA_MAX="2")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.cli", "run", "--all-namespaces", "--metrics-port", str(self.metrics),
             "--health-port", str(health), "--resync-seconds", str(self.resync)],
            env=env, stdout=(self.logdir / f"operator-{self.starts}.log").open("wb"), stderr=subprocess.STDOUT,
            cwd=ROOT)
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def proc_stats(self) -> tuple[float, float]:
        """(peak RSS in MB, CPU seconds so far) of the operator process."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return round(hwm, 1), round(cpu, 1)

    def metric_values(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("kvpilot_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def api_calls(self) -> dict[str, float]:
        """The operator's own count of its API requests, by 'verb resource'."""
        out = {}
        for name, value in self.metric_values().items():
            m = re.match(r'kvpilot_api_requests_total\{resource="([^"]*)",verb="([^"]*)"\}', name)
            if m:
                out[f"{m[2]} {m[1]}"] = value
        return out

    def reconciles(self) -> float:
        return sum(v for k, v in self.metric_values().items() if k.startswith("kvpilot_reconcile_total{"))
