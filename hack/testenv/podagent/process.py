"""One run of one container as a local process group.

Each run gets its own session (process group) so that stopping it also stops whatever a `bash -c`
started, the way a container's cgroup is torn down as a whole. The group id is recorded on disk so
cluster-down.sh can still stop it if the agent itself was killed hard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from .podspec import LaunchPlan

MESSAGE_MAX_BYTES = 4096
FALLBACK_LOG_LINES = 80


def rfc3339_now() -> str:
    """The current UTC time as Kubernetes writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code_of(returncode: int) -> int:
    """A container exit code: a death by signal N is reported as 128 + N, as container runtimes do."""
    return 128 - returncode if returncode < 0 else returncode


class ContainerRun:
    """A started container process; poll() it, stop() it, then read its termination message."""

    def __init__(self, plan: LaunchPlan, log_path: Path, pgid_file: Path) -> None:
        self.plan = plan
        self.log_path = log_path
        self.pgid_file = pgid_file
        log_path.parent.mkdir(parents=True, exist_ok=True)
        Path(plan.termination_log).parent.mkdir(parents=True, exist_ok=True)
        self._reset_termination_log()
        Path(plan.cwd).mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            self._log_offset = out.tell()
            out.write(f"--- {rfc3339_now()} start: {' '.join(plan.argv)}\n".encode())
            self._log_offset = out.tell()
            self.proc = subprocess.Popen(
                plan.argv,
                cwd=plan.cwd,
                env=plan.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pgid = self.proc.pid
        self.started_at = rfc3339_now()
        self.started_mono = time.monotonic()
        pgid_file.parent.mkdir(parents=True, exist_ok=True)
        pgid_file.write_text(str(self.pgid))

    def _reset_termination_log(self) -> None:
        """A fresh message file per run, like the kubelet."""
        Path(self.plan.termination_log).unlink(missing_ok=True)

    def poll(self) -> int | None:
        """The exit code once the main process has exited (its group is then killed), else None."""
        code = self.proc.poll()
        if code is None:
            return None
        self._reap_group()
        return exit_code_of(code)

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole process group."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float) -> int:
        """SIGTERM the group, SIGKILL it after `grace_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(grace_s, 0.0))
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        self._reap_group()
        return exit_code_of(self.proc.returncode)

    def _reap_group(self) -> None:
        """Kill anything left in the group (background children) and forget the recorded pgid."""
        self.signal(signal.SIGKILL)
        self.pgid_file.unlink(missing_ok=True)

    def termination_message(self, exit_code: int, policy: str) -> str:
        """The terminated state's message: the termination-log file, or with FallbackToLogsOnError and a
        failure, the tail of this run's output (at most 80 lines and 4 KiB)."""
        try:
            message = Path(self.plan.termination_log).read_bytes()[:MESSAGE_MAX_BYTES].decode("utf-8", "replace")
        except OSError:
            message = ""
        if message or exit_code == 0 or policy != "FallbackToLogsOnError":
            return message
        try:
            with open(self.log_path, "rb") as log_file:
                end = log_file.seek(0, os.SEEK_END)
                log_file.seek(max(self._log_offset, end - 16 * MESSAGE_MAX_BYTES))
                tail = log_file.read().splitlines()[-FALLBACK_LOG_LINES:]
        except OSError:
            return ""
        return b"\n".join(tail)[-MESSAGE_MAX_BYTES:].decode("utf-8", "replace")


def stop_all(runs: dict[str, ContainerRun], grace_s: float) -> dict[str, int]:
    """SIGTERM every run, SIGKILL what is left after ``grace_s``; empties ``runs`` and returns name -> exit code."""
    codes: dict[str, int] = {}
    for run in runs.values():
        run.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while runs and time.monotonic() < deadline:
        for name, run in list(runs.items()):
            code = run.poll()
            if code is not None:
                codes[name] = code
                del runs[name]
        time.sleep(0.1)
    for name, run in runs.items():
        codes[name] = run.stop(0)
    runs.clear()
    return codes
