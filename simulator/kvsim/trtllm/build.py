"""``kvsim trtllm-build``: TensorRT-LLM 1.2's trtllm-build on the simulated backend.

It parses the real command line (see build_args), reads the checkpoint config, applies the BuildConfig rules
that decide the engine's limits, and writes ``OUTPUT_DIR/config.json`` in TensorRT-LLM's engine shape
(``version``, ``pretrained_config``, ``build_config`` with ``plugin_config``) plus a few-byte placeholder per rank
(``rank0.engine`` ...; not an engine) so the folder looks like an engine directory to tools and caches.

Failure injection for the operator's tests: ``KVSIM_FAIL_BUILD=<message>`` prints the message to stderr and exits
1; ``KVSIM_BUILD_SECONDS`` (default 0) sleeps to mimic build time. ``KVSIM_PERTURB`` (kvsim.perturb) is checked
here as trtllm-serve checks it (a bad value: one line, exit 2) and recorded in the engine's ``kvsim`` section;
the served engine is perturbed by the serving pod's own environment, not by this record. Under a release
without the TensorRT backend (``KVSIM_TRTLLM_RELEASE`` 1.3.0rc21 and later, 1.4) the command does not exist:
kvsim answers as a shell does, ``trtllm-build: command not found`` and exit code 127.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..perturb import Perturbation, PerturbationError
from .releases import ENV as RELEASE_ENV
from .releases import resolve as resolve_release
from .build_args import PLUGIN_ARGS, build_parser
from .checkpoint import config_int, model_spec_from_config, read_config_json

PLACEHOLDER = b"KVSIM-PLACEHOLDER-ENGINE\n"


class BuildError(RuntimeError):
    """The build refuses its inputs (TensorRT-LLM would raise or assert)."""


def _log(level: str, message: str) -> None:
    print(f"[TensorRT-LLM][{level}] {message}", file=sys.stderr if level in ("ERROR", "WARNING") else sys.stdout,
          flush=True)


def plugin_config(args, model_dtype: str) -> dict:
    """PluginConfig as TensorRT-LLM serializes it: "auto" resolves to the model dtype, "disable" to null,
    enable/disable features to booleans."""
    out: dict = {"dtype": model_dtype}
    for name, kind, _ in PLUGIN_ARGS:
        value = getattr(args, name)
        if kind == "bool":
            out[name] = value == "enable"
        elif kind is int:
            out[name] = value
        else:
            out[name] = None if value in (None, "disable") else (model_dtype if value == "auto" else value)
    out["paged_kv_cache"] = True
    return out


def build_config(args, pretrained: dict, overrides: dict | None = None) -> dict:
    """The engine's build_config after TensorRT-LLM's defaults and consistency rules."""
    cfg = {"max_batch_size": args.max_batch_size, "max_input_len": args.max_input_len,
           "max_seq_len": args.max_seq_len, "max_beam_width": args.max_beam_width,
           "max_num_tokens": args.max_num_tokens, "opt_num_tokens": args.opt_num_tokens,
           "kv_cache_type": getattr(args, "kv_cache_type", "PAGED")}
    if overrides:
        cfg.update({k: v for k, v in overrides.items() if k in cfg})
    if hasattr(args, "paged_kv_cache") and not hasattr(args, "kv_cache_type"):
        cfg["kv_cache_type"] = "PAGED" if str(args.paged_kv_cache).lower() in ("enable", "true", "1") else "DISABLED"
    for key in ("max_batch_size", "max_input_len", "max_beam_width", "max_num_tokens", "max_seq_len",
                "opt_num_tokens"):
        if cfg[key] is not None or key not in ("max_seq_len", "opt_num_tokens"):  # those two may be deduced
            try:
                cfg[key] = config_int(cfg, key, "build_config")
            except ValueError as exc:
                raise BuildError(f"build_config.{key} must be a positive integer, got {cfg[key]!r:.60}") from exc
    if cfg["max_seq_len"] is None:
        cfg["max_seq_len"] = int(pretrained.get("max_position_embeddings") or 2048)
        _log("INFO", f"max_seq_len is not specified, using deduced value {cfg['max_seq_len']}")
    if cfg["max_input_len"] > cfg["max_seq_len"]:
        _log("WARNING", f"max_input_len ({cfg['max_input_len']}) is larger than max_seq_len ({cfg['max_seq_len']}), "
                        f"using max_seq_len as max_input_len")
        cfg["max_input_len"] = cfg["max_seq_len"]
    ceiling = cfg["max_batch_size"] * cfg["max_seq_len"]
    if cfg["max_num_tokens"] > ceiling:
        _log("WARNING", f"max_num_tokens ({cfg['max_num_tokens']}) shouldn't be greater than max_seq_len * "
                        f"max_batch_size ({ceiling}), specifying to max_seq_len * max_batch_size ({ceiling}).")
        cfg["max_num_tokens"] = ceiling
    if args.multiple_profiles == "enable":
        cfg["opt_num_tokens"] = None
    elif cfg["opt_num_tokens"] is None:
        cfg["opt_num_tokens"] = min(cfg["max_batch_size"] * cfg["max_beam_width"], cfg["max_num_tokens"])
    cfg.update({
        "max_encoder_input_len": args.max_encoder_input_len,
        "max_prompt_embedding_table_size": args.max_prompt_embedding_table_size,
        "gather_context_logits": args.gather_context_logits or args.gather_all_token_logits,
        "gather_generation_logits": args.gather_generation_logits or args.gather_all_token_logits,
        "strongly_typed": True, "force_num_profiles": None, "weight_sparsity": args.weight_sparsity,
        "weight_streaming": args.weight_streaming, "profiling_verbosity": args.profiling_verbosity,
        "enable_debug_output": args.enable_debug_output, "max_draft_len": args.max_draft_len,
        "speculative_decoding_mode": args.speculative_decoding_mode, "use_refit": False,
        "input_timing_cache": args.input_timing_cache, "output_timing_cache": args.output_timing_cache,
        "lora_config": {"lora_dir": args.lora_dir or [], "lora_ckpt_source": args.lora_ckpt_source,
                        "max_lora_rank": args.max_lora_rank, "lora_target_modules": args.lora_target_modules or []},
        "use_strip_plan": args.strip_plan, "dry_run": args.dry_run, "visualize_network": args.visualize_network,
        "monitor_memory": args.monitor_memory, "use_mrope": False,
        "plugin_config": plugin_config(args, pretrained.get("dtype", "float16")),
    })
    return cfg


def _read_checkpoint(args) -> dict:
    source = args.checkpoint_dir if args.checkpoint_dir is not None else args.model_config
    if source is None:
        raise BuildError("one of --checkpoint_dir or --model_config is required "
                         "(write a checkpoint with `kvsim checkpoint --profile P --output_dir DIR`)")
    path = Path(source) if source.lower().endswith(".json") else Path(source) / "config.json"
    if not path.is_file():
        raise BuildError(f"checkpoint config {path} does not exist")
    try:
        cfg = read_config_json(path, "checkpoint config")
        model_spec_from_config(cfg, str(path))
        mapping = cfg.get("mapping")
        mapping = {} if mapping is None else mapping
        if not isinstance(mapping, dict):
            raise ValueError(f"{path}: mapping must be a JSON object (tp_size, pp_size), got {mapping!r:.60}")
        for key in ("world_size", "tp_size", "pp_size"):
            config_int(mapping, key, f"{path}: mapping", 1)  # absent or 0: deduced, as run_build does
    except ValueError as exc:  # read_config_json and model_spec_from_config say what is wrong, naming the file
        raise BuildError(str(exc)) from None
    return cfg


def run_build(args, perturbation: Perturbation | None = None) -> Path:
    pretrained = _read_checkpoint(args)
    if args.multiple_profiles == "enable" and args.opt_num_tokens is not None:
        raise BuildError("multiple_profiles is enabled, while opt_num_tokens is set. "
                         "They are not supposed to be working in the same time for now.")
    if args.streamingllm == "enable":
        raise BuildError("StreamingLLM is no longer supported because attention sink cannot work with the "
                         "non-cyclic kv cache kernel & runtime changes.")
    tpb = args.tokens_per_block
    if tpb < 2 or tpb & (tpb - 1):
        raise BuildError(f"tokens_per_block must be a power of two greater than 1, got {tpb}")
    overrides = None
    if args.build_config:
        try:
            overrides = read_config_json(Path(args.build_config), "--build_config file")
        except ValueError as exc:
            raise BuildError(str(exc)) from None
    cfg = build_config(args, pretrained, overrides)
    if cfg["kv_cache_type"] == "DISABLED":
        raise BuildError("kvsim simulates in-flight batching, which needs a KV cache: --kv_cache_type paged")
    mapping = pretrained.get("mapping") or {}
    world = int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))
    seconds = float(os.environ.get("KVSIM_BUILD_SECONDS", "0") or 0)
    if seconds > 0:
        time.sleep(seconds)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, object] = {"simulated": True, "builtAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if perturbation is not None and not perturbation.is_identity:
        record["perturbation"] = perturbation.to_text()
    engine = {"version": played_version(), "pretrained_config": pretrained, "build_config": cfg, "kvsim": record}
    (out / "config.json").write_text(json.dumps(engine, indent=4) + "\n")
    for rank in range(world):
        (out / f"rank{rank}.engine").write_bytes(PLACEHOLDER)
    return out


def played_version() -> str:
    """The version of the release kvsim plays (KVSIM_TRTLLM_RELEASE), as the engine's config.json records it."""
    try:
        return resolve_release(os.environ.get(RELEASE_ENV)).version
    except ValueError as exc:
        raise BuildError(str(exc)) from None


COMMAND_NOT_FOUND = 127  # what sh/bash return for a command that is not on PATH


def main(argv: list[str] | None = None) -> int:
    try:
        removed = not resolve_release(os.environ.get(RELEASE_ENV)).tensorrt_backend
    except ValueError:
        removed = False  # played_version() reports the bad value below
    if removed:
        print("trtllm-build: command not found", file=sys.stderr, flush=True)
        return COMMAND_NOT_FOUND
    args = build_parser().parse_args(argv)
    try:
        perturbation = Perturbation.from_env(os.environ)
    except PerturbationError as exc:  # a usage error, like argparse's own: exit 2
        _log("ERROR", str(exc))
        return 2
    failure = os.environ.get("KVSIM_FAIL_BUILD")
    if failure:
        print(failure, file=sys.stderr, flush=True)
        return 1
    if hasattr(args, "paged_kv_cache"):
        _log("WARNING", "Option --paged_kv_cache is deprecated, use --kv_cache_type=paged/disabled instead.")
    started = time.time()
    try:
        _log("INFO", f"TensorRT LLM version: {played_version()} (kvsim simulated backend)")
        out = run_build(args, perturbation)
    except BuildError as exc:
        _log("ERROR", str(exc))
        return 1
    _log("INFO", f"Engine (simulated) and config written to {out}")
    _log("INFO", "Total time of building all engines: " + time.strftime("%H:%M:%S", time.gmtime(time.time() - started)))
    return 0
