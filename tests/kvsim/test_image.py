"""The kvsim image: shims that put trtllm-build / trtllm-serve on PATH, a non-root Dockerfile (no Docker here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kvsim.helpers import BLOG_ONLY_FLAGS, flag

IMAGE = Path(__file__).resolve().parents[2] / "images" / "kvsim"


@pytest.mark.parametrize("tool, sub", [("trtllm-build", "trtllm-build"), ("trtllm-serve", "trtllm-serve")])
def test_shims_forward_every_argument_to_kvsim(tool, sub, tmp_path):
    shim = IMAGE / "bin" / tool
    assert shim.stat().st_mode & stat.S_IXUSR
    assert f'exec kvsim {sub} "$@"' in shim.read_text()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(shim), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "--max_batch_size" in proc.stdout
    bad = subprocess.run([str(shim), "model", flag(BLOG_ONLY_FLAGS[0])], capture_output=True, text=True, env=env,
                         timeout=60)
    assert bad.returncode == 2


def test_dockerfile_installs_the_package_and_runs_as_non_root():
    text = (IMAGE / "Dockerfile").read_text()
    assert "pip install /wheels/*.whl" in text and "COPY simulator ./simulator" in text
    user_lines = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert user_lines and all(not u.startswith(("0", "root")) for u in user_lines)
    assert "images/kvsim/bin/trtllm-build" in text and "/usr/local/bin/" in text
