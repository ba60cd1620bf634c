"""Runs a rendered build script for real, with stub binaries, in a temporary directory.

The stubs (python3, trtllm-build, kvsim) record their argv one file per call, so a test can check that every
spec value reached its process intact and that nothing else ran. The script's mount points (/engines, /model,
/calibration, /dev/termination-log) are moved under the temporary directory by patching the module constants
the script is rendered from, never by editing the rendered text.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from unittest import mock

from kvpilot.trtllm import calibration, probe
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm import build as B
from kvpilot.trtllm import build_script as S

STUBS = ("python3", "trtllm-build", "kvsim")
HOSTNAME = "build-pod-0"
STAGE_PATHS = ("$STAGE/checkpoint", "$STAGE/engine")  # the only arguments bash expands
STUB = """#!/bin/bash
n=$(ls "$KVPILOT_ARGV_DIR" | wc -l)
f="$KVPILOT_ARGV_DIR/$(printf %04d "$n")"
printf '%s\\0' "$(basename "$0")" "$@" > "$f"
"""


@dataclass
class Sandbox:
    root: Path

    @property
    def cache(self) -> Path:
        return self.root / "engines"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def calibration(self) -> Path:
        return self.root / "calibration"

    @property
    def termination_log(self) -> Path:
        return self.root / "termination-log"

    @property
    def argv_dir(self) -> Path:
        return self.root / "argv"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def stage(self, fingerprint: str) -> str:
        return f"{self.cache}/.staging/{fingerprint}-{HOSTNAME}"


def make_sandbox(root: Path, failing: tuple[str, ...] = ()) -> Sandbox:
    """Stubs named in ``failing`` record their argv, then exit 1 (a failed conversion or build)."""
    sb = Sandbox(root)
    for d in (sb.cache, sb.model, sb.calibration, sb.argv_dir, sb.bin):
        d.mkdir(parents=True, exist_ok=True)
    for name in STUBS:
        stub = sb.bin / name
        stub.write_text(STUB + ("exit 1\n" if name in failing else ""))
        stub.chmod(0o755)
    return sb


@contextmanager
def mounts_in(sb: Sandbox) -> Iterator[None]:
    """Render with the sandbox's directories in place of the pod's mount points."""
    with mock.patch.multiple(B, CACHE_MOUNT=str(sb.cache), MODEL_MOUNT=str(sb.model),
                             CALIBRATION_MOUNT=str(sb.calibration)), \
            mock.patch.object(S, "TERMINATION_LOG", str(sb.termination_log)):
        yield


def render(sb: Sandbox, spec: InferenceEngineSpec, fingerprint: str, image: str = "img:1", mbs: int = 64) -> str:
    with mounts_in(sb):
        return S.build_script(spec, fingerprint, image, mbs)


def expected_argvs(sb: Sandbox, spec: InferenceEngineSpec, fingerprint: str, mbs: int = 64) -> list[list[str]]:
    """What each stub must receive: the rendered commands, with $STAGE paths expanded as bash would."""
    with mounts_in(sb):
        cmds = S.build_commands(spec, fingerprint, mbs)
        preflight = calibration.preflight_lines(spec)
        dataset = calibration.calibration_dataset(spec) if preflight else ""
    # The calibration set's layout check runs first, with the dataset path as its one argument.
    out = [["python3", "-c", calibration.CHECK_PY, dataset]] if preflight else []
    for cmd in cmds:
        argv = [sb.stage(fingerprint) + a[len("$STAGE"):] if a in STAGE_PATHS else a for a in cmd.argv]
        argv[0] = os.path.basename(argv[0])
        out.append(argv)
    return out


def run(sb: Sandbox, script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{sb.bin}:/usr/bin:/bin", "HOSTNAME": HOSTNAME, "KVPILOT_ARGV_DIR": str(sb.argv_dir),
           "HOME": str(sb.root), "LC_ALL": "C.UTF-8"}
    return subprocess.run(["bash", "-c", script], env=env, cwd=sb.root, capture_output=True, text=True,
                          timeout=timeout)


def recorded_argvs(sb: Sandbox) -> list[list[str]]:
    """The stubs' argvs in call order, less the release probe's two fixed `python3 -c` programs (they carry
    no spec value; trtllm/probe.py), so the list matches ``expected_argvs``. The two run at once in a pipe, so
    their stub records may race for one slot: either may be the one found, and both are left out."""
    calls = []
    for f in sorted(sb.argv_dir.iterdir()):
        argv = f.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
        if argv[:2] == ["python3", "-c"] and len(argv) >= 3 and (
                argv[2] == probe.probe_source() or "import tensorrt_llm" in argv[2] or "m['trtllm']" in argv[2]):
            continue
        calls.append(argv)
    return calls


def syntax_ok(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
