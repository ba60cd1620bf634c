"""The kvsim image's shims that put trtllm-build / trtllm-serve on PATH."""

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


# The built image itself (user, entrypoints, read-only root) is checked in tests/chart/test_images.py.
