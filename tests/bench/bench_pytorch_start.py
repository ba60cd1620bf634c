"""Start to /health of kvsim's PyTorch trtllm-serve, with and without what the prepare Job leaves: an HF id with no
autotuner cache (each pod downloads and tunes) against the prepared checkpoint with its warm-up cache.

Real processes, wall seconds at ``KVSIM_SPEEDUP`` (default 10, as the e2e tests run), and kvsim's simulated
seconds (wall x speedup). The download and autotune figures are kvsim's stated assumptions
(simulator/kvsim/serve/warmup.py), not GPU measurements.

Run: ``python -m tests.bench.bench_pytorch_start``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROFILE = "llama-3.1-8b-fp8-h100"
KVSIM = str(Path(sys.executable).parent / "kvsim")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CHARGED = re.compile(r"([0-9.]+) s (?:to capture )?\(simulated")  # kvsim's own start-up log lines


def start_to_health(model: str, env: dict[str, str], yaml_path: Path, log: Path) -> tuple[float, float]:
    """(wall seconds to /health, simulated seconds kvsim charged: download + autotune + CUDA-graph capture)."""
    port = _port()
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([KVSIM, "trtllm-serve", model, "--backend", "pytorch", "--host", "127.0.0.1",
                                 "--port", str(port), "--max_batch_size", "64", "--max_seq_len", "4096",
                                 "--extra_llm_api_options", str(yaml_path)],
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"kvsim trtllm-serve exited with {proc.returncode}: {log.read_text()[-500:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                        if reply.status == 200:
                            wall = time.monotonic() - started
                            break
                except OSError:
                    pass
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(30)
    return wall, sum(float(m) for m in CHARGED.findall(log.read_text()))


def main() -> None:
    speedup = float(os.environ.get("KVSIM_SPEEDUP", "10"))
    base = {"KVSIM_PROFILE": PROFILE, "KVSIM_TRTLLM_RELEASE": "1.4", "KVSIM_SPEEDUP": f"{speedup:g}"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run([KVSIM, "prepare", "--profile", PROFILE, "--output_dir", str(root / "ckpt"), "--warmup_dir",
                        str(root / "warmup")], check=True, capture_output=True)
        yaml_path = root / "llm-api.yaml"
        yaml_path.write_text("enable_iter_perf_stats: true\ncuda_graph_config: {max_batch_size: 64, "
                             "enable_padding: true}\n")
        cache = {"TLLM_AUTOTUNER_CACHE_PATH": str(root / "warmup" / "autotuner.json")}
        log = root / "serve.log"
        warm_up = start_to_health(str(root / "ckpt"), {**base, **cache}, yaml_path, log)  # the prepare's warm-up
        rows = [("each pod downloads and tunes (HF id, no cache)", start_to_health(
                    "meta-llama/Llama-3.1-8B-Instruct", base, yaml_path, log)),
                ("prepared checkpoint + warm-up cache", start_to_health(str(root / "ckpt"), {**base, **cache},
                                                                        yaml_path, log))]
    print(f"kvsim trtllm-serve, {PROFILE}, KVSIM_TRTLLM_RELEASE=1.4, max_batch_size 64, speedup x{speedup:g}")
    print(f"  {'':<48} {'wall to /health':>16} {'kvsim charged (simulated)':>26}")
    for label, (wall, charged) in [("the prepare Job's warm-up (tunes into the cache)", warm_up), *rows]:
        print(f"  {label:<48} {wall:14.2f} s {charged:24.1f} s")
    print(f"  difference per pod start: {rows[0][1][1] - rows[1][1][1]:.1f} s simulated, "
          f"{rows[0][1][0] - rows[1][1][0]:.2f} s wall")

if __name__ == "__main__":
    main()
