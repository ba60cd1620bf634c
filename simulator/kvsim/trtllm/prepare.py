"""``kvsim prepare``: the PyTorch backend's prepare Job on the simulated backend.

A real prepare Job (kvpilot's operator/kvpilot/trtllm/prepare.py) fetches a Hugging Face checkpoint, optionally
quantizes it with NVIDIA ModelOpt, and warms trtllm-serve up so the PyTorch kernel autotuner writes its cache
(``TLLM_AUTOTUNER_CACHE_PATH``). This stands in for the fetch and the quantization, and for what that warm-up
leaves behind:

- ``OUTPUT_DIR/config.json``: the profile's checkpoint config (as ``kvsim checkpoint`` writes it; kvsim's
  trtllm-serve reads the model from it), plus ``hf_quant_config.json`` when quantizing, the file ModelOpt's
  ``export_hf_checkpoint`` writes beside a quantized checkpoint;
- ``WARMUP_DIR/autotuner.json``: a cache in the layout of TensorRT-LLM's ``AutoTunerProfilingCache.save_cache``
  (a ``metadata`` object with ``lib_version``, ``device_name``, ``device_capability``, then one ``rank_<N>`` object
  per rank). kvsim models no kernel tactics, so each rank's entries start empty; the warm-up (kvsim's
  trtllm-serve on the staged checkpoint, serve/warmup.py) then records the token buckets it tuned.

``KVSIM_BUILD_SECONDS`` (default 0) sleeps to mimic the prepare's time, as for kvsim's trtllm-build; failure
injection for the operator's tests: ``KVSIM_FAIL_BUILD=<message>`` prints the message to stderr and exits 1 before
anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..profiles import get_profile
from .checkpoint import checkpoint_config
from .releases import ENV as RELEASE_ENV
from .releases import resolve as resolve_release

QUANT_ALGOS = {"none": None, "fp8": "FP8", "nvfp4": "NVFP4"}  # kvpilot's names -> ModelOpt's quant_algo


def autotuner_cache(version: str, gpu: str, ranks: int) -> dict:
    """An autotuner cache file's content: TensorRT-LLM's metadata, one (empty) section per rank."""
    cache: dict = {"metadata": {"lib_version": version, "creation_timestamp": time.time(), "device_name": gpu,
                                "device_capability": None, "producer": "kvsim"}}
    for rank in range(ranks):
        cache[f"rank_{rank}"] = {}
    return cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvsim prepare", description="Write what a PyTorch prepare Job publishes: the checkpoint config (no "
        "weights) and the kernel autotuner's warm-up cache, for a profile.")
    parser.add_argument("--profile", required=True, help="<model>-<dtype>-<gpu>[-tpN]")
    parser.add_argument("--output_dir", required=True, type=Path, help="the checkpoint directory to write")
    parser.add_argument("--warmup_dir", required=True, type=Path, help="where the autotuner cache goes")
    parser.add_argument("--tp_size", type=int, default=None, help="default: the profile's TP")
    parser.add_argument("--pp_size", type=int, default=1)
    parser.add_argument("--quantization", choices=sorted(QUANT_ALGOS), default="none")
    args = parser.parse_args(argv)
    try:
        profile = get_profile(args.profile)
        release = resolve_release(os.environ.get(RELEASE_ENV))
    except (KeyError, ValueError) as exc:
        print(f"kvsim prepare: {exc.args[0]}", file=sys.stderr)
        return 1
    if (args.tp_size is not None and args.tp_size < 1) or args.pp_size < 1:
        print("kvsim prepare: --tp_size and --pp_size must be >= 1", file=sys.stderr)
        return 1
    failure = os.environ.get("KVSIM_FAIL_BUILD")
    if failure:
        print(failure, file=sys.stderr, flush=True)
        return 1
    seconds = float(os.environ.get("KVSIM_BUILD_SECONDS", "0") or 0)
    if seconds > 0:
        time.sleep(seconds)
    cfg = checkpoint_config(profile, args.tp_size, args.pp_size)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
    algo = QUANT_ALGOS[args.quantization]
    if algo is not None:
        quant = {"producer": {"name": "kvsim"}, "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None}}
        (args.output_dir / "hf_quant_config.json").write_text(json.dumps(quant, indent=4) + "\n")
    ranks = cfg["mapping"]["world_size"]
    args.warmup_dir.mkdir(parents=True, exist_ok=True)
    cache = autotuner_cache(release.version, profile.gpu.name, ranks)
    (args.warmup_dir / "autotuner.json").write_text(json.dumps(cache, indent=2) + "\n")
    print(f"kvsim prepare: wrote {args.output_dir / 'config.json'} ({profile.model.name}, quantization "
          f"{args.quantization}) and {args.warmup_dir / 'autotuner.json'} ({ranks} ranks, TensorRT-LLM "
          f"{release.version})")
    return 0
