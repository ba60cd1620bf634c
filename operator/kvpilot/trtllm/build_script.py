"""Assembles the build Job's bash script from the commands rendered in ``build.py``."""

from __future__ import annotations

import json
import shlex

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm import calibration, probe
from kvpilot.trtllm.build import (
    MANIFEST,
    ORPHAN_AFTER_MINUTES,
    TERMINATION_LOG,
    BuildPaths,
    Command,
    convert,
    hf_download,
    model_dir,
    simulated_checkpoint,
    trtllm_build,
)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "vocab.json",
    "merges.txt",
)


def build_commands(spec: InferenceEngineSpec, fingerprint: str, max_batch_size: int) -> list[Command]:
    """Every command the build runs, in order (what the option-list tests check)."""
    if spec.runtime.backend == "simulated":
        paths = BuildPaths(fingerprint, model_dir="")
        return [simulated_checkpoint(spec, paths), trtllm_build(spec.build, paths, max_batch_size)]
    paths = BuildPaths(fingerprint, model_dir=model_dir(spec))
    steps = []
    if spec.model.scheme == "hf":
        steps.append(hf_download(spec, paths.model_dir))
    steps += [convert(spec, paths), trtllm_build(spec.build, paths, max_batch_size)]
    return steps


def manifest(spec: InferenceEngineSpec, fingerprint: str, image: str, max_batch_size: int) -> dict[str, object]:
    """What the published engine says about itself (read back into the InferenceEngine's status)."""
    b = spec.build
    return {
        "fingerprint": fingerprint,
        "image": image,
        "model": {"source": spec.model.source, "revision": spec.model.revision},
        "backend": spec.runtime.backend,
        "maxBatchSize": max_batch_size,
        "maxNumTokens": b.max_num_tokens,
        "maxInputLen": b.max_input_len,
        "maxSeqLen": b.max_seq_len,
        "tokensPerBlock": b.kv_cache.tokens_per_block,
        "tensorParallelSize": b.tensor_parallel_size,
        "pipelineParallelSize": b.pipeline_parallel_size,
        "quantization": b.quantization,
        "kvCacheDtype": b.kv_cache_dtype,
    }


def staging_cleanup(paths: BuildPaths) -> list[str]:
    """A failed build removes its staging directory (it holds a converted checkpoint: a full disk must not get
    fuller with each retry); the staging directories of pods that died without their trap are collected."""
    return [
        "trap 'rm -rf \"$STAGE\"' EXIT",
        "trap 'exit 143' TERM",
        f"find {shlex.quote(paths.staging_root)} -mindepth 1 -maxdepth 1 -mmin +{ORPHAN_AFTER_MINUTES} "
        "-exec rm -rf -- {} + 2>/dev/null || true",
    ]


def build_script(spec: InferenceEngineSpec, fingerprint: str, image: str, max_batch_size: int) -> str:
    """The whole build as a bash script: cache check, staging, the commands, atomic publish."""
    paths = BuildPaths(fingerprint, model_dir=model_dir(spec) if spec.runtime.backend != "simulated" else "")
    final, stage = shlex.quote(paths.final), paths.stage
    body = json.dumps(manifest(spec, fingerprint, image, max_batch_size), sort_keys=True)
    lines = [
        "set -euo pipefail",
        f"echo 'kvpilot: engine {fingerprint}'",
        f"if [ -f {final}/{MANIFEST} ]; then",
        "  echo 'kvpilot: engine already in the cache; nothing to build'",
        f"  cp {final}/{MANIFEST} {TERMINATION_LOG}",
        "  exit 0",
        "fi",
        f'STAGE="{stage}"',
        *staging_cleanup(paths),
        'rm -rf "$STAGE" && mkdir -p "$STAGE/tokenizer"',
        *calibration.preflight_lines(spec),
    ]
    for step in build_commands(spec, fingerprint, max_batch_size):
        lines.append(f"echo '+ {step.tool}'")
        lines.append(step.shell())
    if paths.model_dir:
        files = " ".join(TOKENIZER_FILES)
        src = shlex.quote(paths.model_dir)
        lines += [
            f"for f in {files}; do",
            f'  if [ -f {src}/"$f" ]; then cp -- {src}/"$f" "$STAGE/tokenizer/"; fi',
            "done",
        ]
    lines += [
        'rm -rf "$STAGE/checkpoint"',
        f'printf \'%s\\n\' {shlex.quote(body)} > "$STAGE/{MANIFEST}"',
        *(probe.record_lines(f'"$STAGE/{MANIFEST}"') if spec.runtime.backend != "simulated" else []),
        "# Publish atomically; if another builder published first, its engine is identical.",
        f'mv -T "$STAGE" {final} || {{ [ -f {final}/{MANIFEST} ] && rm -rf "$STAGE"; }}',
        f"cp {final}/{MANIFEST} {TERMINATION_LOG}",
        f"echo {shlex.quote('kvpilot: published ' + paths.final)}",
    ]
    return "\n".join(lines) + "\n"
