"""Start ``kvsim trtllm-serve`` as a real process on a free local port, and stop it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

KVSIM = str(Path(sys.executable).with_name("kvsim"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """HTTP status of a GET, or None when the connection is refused."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@contextmanager
def serve(args: list[str], env: dict[str, str] | None = None, ready_timeout_s: float = 30.0):
    """Yield (base_url, process) once /health answers 200."""
    port = free_port()
    full_env = {**os.environ, "KVSIM_PROFILE": "llama-3.1-8b-fp8-h100", **(env or {})}
    proc = subprocess.Popen([KVSIM, "trtllm-serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while http_status(base + "/health") != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"trtllm-serve exited {proc.returncode}: {proc.stdout.read()}")
            if time.monotonic() > deadline:
                raise TimeoutError("trtllm-serve did not become healthy")
            time.sleep(0.05)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
