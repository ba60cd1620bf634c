"""Assembles the build (``build.py``) and prepare (``prepare.py``) Jobs' bash scripts.

Both share the cache guarantees: a Job that finds its manifest exits at once (never built or prepared twice), the
work happens in a staging directory removed on any exit (and orphans of killed pods are collected), and the result
appears under its fingerprint with one atomic ``mv -T`` only once everything succeeded.
"""

from __future__ import annotations

import json
import shlex

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm import calibration, prepare, probe
from kvpilot.trtllm.release import AUTOTUNER_CACHE_ENV
from kvpilot.trtllm.surface import Surface
from kvpilot.trtllm.build import (
    MANIFEST,
    ORPHAN_AFTER_MINUTES,
    TERMINATION_LOG,
    BuildPaths,
    Command,
    convert,
    hf_download,
    manifest_base,
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
    return {**manifest_base(spec, fingerprint, image), "maxBatchSize": max_batch_size,
            "maxNumTokens": b.max_num_tokens, "maxInputLen": b.max_input_len}


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
    real = spec.runtime.backend != "simulated"
    lines = [*(probe.refuse_lines(image, spec) if real else []), *calibration.preflight_lines(spec)]
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
    lines.append('rm -rf "$STAGE/checkpoint"')
    body = manifest(spec, fingerprint, image, max_batch_size)
    return _job_script(paths, ("engine", "build", "builder", "engine"), "mkdir -p \"$STAGE/tokenizer\"", lines, body,
                       record_probe=real)


def _warmup_lines(spec: InferenceEngineSpec, paths: BuildPaths, batch: int, surface: Surface) -> list[str]:
    """The warm-up step, or why there is none: a multi-node engine's ranks do not fit the prepare Job's one pod, so
    its checkpoint is published unserved and each group's leader tunes its kernels at its first start (the warm
    directory stays empty, and the serving pods' copy of it is a no-op)."""
    if spec.multinode:
        return ["echo '+ warm-up skipped: a multi-node engine does not fit one pod; groups tune kernels at start'"]
    config = shlex.quote(prepare.warmup_config(spec, batch, surface))
    warm = prepare.warmup(spec, paths, batch)
    return [
        f"printf '%s' {config} > \"$STAGE/{prepare.WARMUP_DIR}/llm-api.yaml\"",
        f'export {AUTOTUNER_CACHE_ENV}="$STAGE"/{prepare.WARMUP_DIR}/{prepare.AUTOTUNER_FILE}',
        f"echo '+ {warm.tool}: trtllm-serve until /health answers (the kernel autotuner writes its cache)'",
        warm.shell(),
        f'rm -f "$STAGE/{prepare.WARMUP_DIR}/llm-api.yaml"',
    ]


def prepare_script(spec: InferenceEngineSpec, fingerprint: str, image: str, batch: int, surface: Surface) -> str:
    """The PyTorch prepare as a bash script: fetch, optional ModelOpt quantization, warm-up, atomic publish."""
    paths = prepare.prepare_paths(spec, fingerprint)
    lines = list(calibration.preflight_lines(spec))
    for step in prepare.fetch_and_quantize(spec, paths):
        lines += [f"echo '+ {step.tool}'", step.shell()]
    lines += prepare.link_lines(spec, paths)
    lines += _warmup_lines(spec, paths, batch, surface)
    body = prepare.prepare_manifest(spec, fingerprint, image, batch)
    words = ("prepared checkpoint", "prepare", "prepare Job", "checkpoint")
    return _job_script(paths, words, f"mkdir -p \"$STAGE/{prepare.WARMUP_DIR}\"", lines, body,
                       record_probe=spec.runtime.backend != "simulated")


def _job_script(paths: BuildPaths, words: tuple[str, str, str, str], mkdir: str, work: list[str],
                body: dict[str, object], record_probe: bool) -> str:
    """Cache check, staging and cleanup, ``work``, manifest (and probe), atomic publish. ``words``: what is made,
    the verb, who makes it, and what the result is called (the log lines say it in the Job's own terms)."""
    what, verb, maker, result = words
    final, fingerprint = shlex.quote(paths.final), paths.fingerprint
    text = json.dumps(body, sort_keys=True)
    lines = [
        "set -euo pipefail",
        f"echo 'kvpilot: {what} {fingerprint}'",
        f"if [ -f {final}/{MANIFEST} ]; then",
        f"  echo 'kvpilot: {what} already in the cache; nothing to {verb}'",
        f"  cp {final}/{MANIFEST} {TERMINATION_LOG}",
        "  exit 0",
        "fi",
        f'STAGE="{paths.stage}"',
        *staging_cleanup(paths),
        f'rm -rf "$STAGE" && {mkdir}',
        *work,
        f'printf \'%s\\n\' {shlex.quote(text)} > "$STAGE/{MANIFEST}"',
        *(probe.record_lines(f'"$STAGE/{MANIFEST}"') if record_probe else []),
        f"# Publish atomically; if another {maker} published first, its {result} is identical.",
        f'mv -T "$STAGE" {final} || {{ [ -f {final}/{MANIFEST} ] && rm -rf "$STAGE"; }}',
        f"cp {final}/{MANIFEST} {TERMINATION_LOG}",
        f"echo {shlex.quote('kvpilot: published ' + paths.final)}",
    ]
    return "\n".join(lines) + "\n"
