"""Renders the PyTorch backend's prepare Job: its counterpart of the TensorRT build.

The PyTorch backend needs no engine, but each serving pod used to download the checkpoint itself into a read-write
mount of the shared cache (replicas raced, a ReadWriteOnce claim could not serve two nodes), could not be quantized,
and re-tuned its kernels at every start. The prepare Job does that work once per fingerprint, in the serving image,
on the serving GPU product:

1. fetch the checkpoint at its pinned revision (hf://; s3:// by the same init container as the build), hard-linked
   from the shared download cache into the staged engine;
2. optionally quantize it with NVIDIA ModelOpt (fp8, nvfp4) into a Hugging Face checkpoint the PyTorch backend loads
   (TRT-LLM docs/source/features/quantization.md: "can directly run pre-quantized models generated with" ModelOpt;
   the release's documented path is ModelOpt's examples/llm_ptq, not shipped in the image, which calls the same
   two public APIs used here: ``modelopt.torch.quantization.quantize`` and
   ``modelopt.torch.export.export_hf_checkpoint``; nvidia-modelopt[torch]~=0.37.0 is a dependency of
   tensorrt_llm, PyPI PKG-INFO of 1.3.0rc15 and rc22);
3. warm up: start ``trtllm-serve`` on the staged checkpoint with the serving flags and LLM-API YAML until /health
   answers, with ``TLLM_AUTOTUNER_CACHE_PATH`` in the staged engine, so the PyTorch kernel autotuner writes the cache
   later starts load (options/releases.yaml, autotuner_cache_env) — and the checkpoint is proven to serve before
   it is published.

Then it publishes like the build: staged on the claim, one atomic ``mv -T`` next to ``kvpilot-engine.json``; a
Job that finds the manifest exits at once. On the simulated backend ``kvsim prepare`` stands in for steps 1-2
(and writes kvsim's warm-up cache), and the warm-up runs kvsim's trtllm-serve the same way.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm import release
from kvpilot.trtllm.build import (
    MODEL_MOUNT,
    BuildPaths,
    Command,
    StagePath,
    calibration_dataset,
    hf_download,
    manifest_base,
    model_dir,
)
from kvpilot.trtllm.serve import ServedEngine, llm_api_options, serve_command, served_checkpoint
from kvpilot.trtllm.surface import Surface

WARMUP_DIR = "warmup"
AUTOTUNER_FILE = "autotuner.json"
QFORMATS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}  # ModelOpt's predefined configs

# ModelOpt post-training quantization into a unified Hugging Face checkpoint (runs in the serving image). The
# calibration set is read as TensorRT-LLM's quantize.py reads it (trtllm/calibration.py checks a local one first).
MODELOPT_PY = r'''
import sys
import torch
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
src, dst, config, dtype, dataset, size, seqlen = sys.argv[1:8]
size, seqlen = int(size), int(seqlen)
tokenizer = AutoTokenizer.from_pretrained(src)
model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=getattr(torch, dtype), device_map="auto")
if "cnn_dailymail" in dataset:
    rows, column = load_dataset(dataset, name="3.0.0", split="train"), "article"
else:
    rows, column = load_dataset(dataset, split="train"), "text"
texts = [t for t in rows.select(range(min(size, rows.num_rows)))[column] if t]
def calibrate(m):
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=seqlen).input_ids
            m(ids.to(m.device))
model = mtq.quantize(model, getattr(mtq, config), calibrate)
with torch.inference_mode():
    export_hf_checkpoint(model, export_dir=dst)
tokenizer.save_pretrained(dst)
print("kvpilot: quantized %s with ModelOpt %s on %d calibration samples" % (src, config, len(texts)))
'''

# Starts trtllm-serve (argv after the port and the deadline), waits for /health to answer 200, then stops it.
# Standard library only. 0.0.0.0: the server binds every interface and the probe connects to it locally.
WARMUP_PY = r'''
import signal, subprocess, sys, time, urllib.request
port, deadline, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
start = time.monotonic()
proc = subprocess.Popen(argv)
def stop():
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
while True:
    if proc.poll() is not None:
        sys.stderr.write("kvpilot: the warm-up trtllm-serve exited with %s before /health answered\n" % proc.returncode)
        sys.exit(4)
    if time.monotonic() - start > deadline:
        stop()
        sys.stderr.write("kvpilot: the warm-up trtllm-serve did not answer /health within %.0f s "
                         "(serving.startupTimeoutSeconds)\n" % deadline)
        sys.exit(4)
    try:
        with urllib.request.urlopen("http://0.0.0.0:%d/health" % port, timeout=5) as reply:
            if reply.status == 200:
                break
    except Exception:
        pass
    time.sleep(2)
print("kvpilot: warm-up served /health after %.1f s" % (time.monotonic() - start), flush=True)
stop()
'''


def prepare_paths(spec: InferenceEngineSpec, fingerprint: str) -> BuildPaths:
    return BuildPaths(fingerprint, model_dir=model_dir(spec) if spec.runtime.backend != "simulated" else "")


def staged_checkpoint(spec: InferenceEngineSpec, paths: BuildPaths) -> str:
    """The checkpoint the warm-up serves: the staged one, or a pvc:// one in place (nothing to fetch or quantize)."""
    served = served_checkpoint(spec, ServedEngine(paths.fingerprint, 1, 1, 1, 1))
    return served if served.startswith(MODEL_MOUNT) else StagePath("checkpoint")


def fetch_and_quantize(spec: InferenceEngineSpec, paths: BuildPaths) -> list[Command]:
    """Steps 1-2: the checkpoint into the staged engine (kvsim's stand-in on the simulated backend)."""
    b = spec.build
    if spec.runtime.backend == "simulated":
        assert spec.runtime.simulation is not None
        argv = ["kvsim", "prepare", "--profile", spec.runtime.simulation.profile, "--output_dir", paths.checkpoint,
                "--warmup_dir", StagePath(WARMUP_DIR), "--tp_size", str(b.tensor_parallel_size),
                "--pp_size", str(b.pipeline_parallel_size), "--quantization", b.quantization]
        return [Command("kvsim_prepare", tuple(argv))]
    steps = [hf_download(spec, paths.model_dir)] if spec.model.scheme == "hf" else []
    if b.quantization in QFORMATS:
        steps.append(Command("python", (
            "python3", "-c", MODELOPT_PY, paths.model_dir, paths.checkpoint, QFORMATS[b.quantization], b.dtype,
            calibration_dataset(spec), str(b.calibration.size), str(b.calibration.max_seq_length))))
    return steps


def link_lines(spec: InferenceEngineSpec, paths: BuildPaths) -> list[str]:
    """A fetched, unquantized checkpoint enters the staged engine as hard links to the shared download (no second
    copy on the claim), or as a copy where the filesystem has no hard links."""
    if spec.runtime.backend == "simulated" or spec.build.quantization in QFORMATS or spec.model.scheme == "pvc":
        return []
    link = Command("cp", ("cp", "-al", "--", paths.model_dir, paths.checkpoint)).shell()
    copy = Command("cp", ("cp", "-a", "--", paths.model_dir, paths.checkpoint)).shell()
    return ["echo '+ link the checkpoint into the engine'", f'{link} || {{ rm -rf "$STAGE/checkpoint"; {copy}; }}']


def warmup(spec: InferenceEngineSpec, paths: BuildPaths, batch: int) -> Command:
    """Step 3: trtllm-serve on the staged checkpoint with the serving flags, its LLM-API YAML staged beside it."""
    b = spec.build
    engine = ServedEngine(paths.fingerprint, batch, spec.batching.max_num_tokens, b.tensor_parallel_size,
                          b.pipeline_parallel_size)
    argv = list(serve_command(spec, engine, batch).argv)
    argv[1] = staged_checkpoint(spec, paths)
    argv[argv.index("--extra_llm_api_options") + 1] = StagePath(f"{WARMUP_DIR}/llm-api.yaml")
    return Command("warmup", ("python3", "-c", WARMUP_PY, str(spec.serving.port),
                              str(spec.serving.startup_timeout_seconds), *argv))


def warmup_config(spec: InferenceEngineSpec, batch: int, surface: Surface) -> str:
    """The LLM-API YAML the warm-up serves with: the one serving renders for the same limit."""
    options = llm_api_options(spec, None, batch, surface)
    return yaml.safe_dump(options, sort_keys=False)


def prepare_commands(spec: InferenceEngineSpec, fingerprint: str, batch: int) -> list[Command]:
    """Every command the prepare runs, in order (what the option-list tests check)."""
    paths = prepare_paths(spec, fingerprint)
    return [*fetch_and_quantize(spec, paths), warmup(spec, paths, batch)]


def prepare_manifest(spec: InferenceEngineSpec, fingerprint: str, image: str, batch: int) -> dict[str, Any]:
    """What the prepared engine says about itself (read back into the InferenceEngine's status)."""
    return {**manifest_base(spec, fingerprint, image), "kind": "prepared", "maxBatchSize": batch,
            "maxNumTokens": spec.batching.max_num_tokens, "warmupCache": f"{WARMUP_DIR}/{AUTOTUNER_FILE}",
            "autotunerCacheEnv": release.AUTOTUNER_CACHE_ENV}
