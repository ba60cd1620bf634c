"""From trtllm-serve's command line, its YAML and the environment to an ``EngineConfig``.

Order as in TensorRT-LLM 1.2's serve(): the CLI builds the LLM arguments (with the serve defaults
KvCacheConfig(free_gpu_memory_fraction), SchedulerConfig(GUARANTEED_NO_EVICT, dynamic batch tuning on, window
128)), then ``update_llm_args_with_extra_dict`` lets the YAML override them: a top-level YAML key replaces the
CLI value, and a YAML section (kv_cache_config, scheduler_config, ...) replaces the CLI-built section as a whole,
so unspecified fields of that section fall back to the class defaults. Runtime limits are then checked against
the engine's build_config exactly as ``validate_build_config_with_runtime_params`` does.

Environment: KVSIM_PROFILE (required: the GPU, the calibration, and the model for HF ids), KVSIM_SPEEDUP
(simulated seconds per wall second, default 1), KVSIM_STARTUP_SECONDS (model-load delay, default 0),
KVSIM_TRTLLM_RELEASE (the release whose surface kvsim plays, see ``trtllm/releases.py``; default 1.2.0),
KVSIM_PERTURB (multipliers on the profile's calibration and GPU memory, see ``perturb.py``; a bad value raises
PerturbationError, which the command reports as a usage error, exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config import Backend, CapacityPolicy, EngineConfig, KvCacheType
from ..cuda_graphs import CudaGraphConfigError, CudaGraphs
from ..memory import plan_for
from ..perturb import Perturbation
from ..profiles import Profile, get_profile
from ..trtllm import TRTLLM_VERSION
from ..trtllm.checkpoint import model_spec_from_config, read_config_json
from ..trtllm.engine_dir import is_engine_dir, load_engine_dir
from ..trtllm.releases import Release
from ..trtllm.releases import resolve as resolve_release

KV_CACHE_KEYS = {"enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length",
                 "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction",
                 "secondary_offload_min_priority", "event_buffer_max_size", "attention_dp_events_gather_period_ms",
                 "enable_partial_reuse", "copy_on_partial_reuse", "use_uvm", "max_gpu_total_bytes", "dtype",
                 "mamba_ssm_cache_dtype", "tokens_per_block"}
SCHEDULER_KEYS = {"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config",
                  "waiting_queue_policy"}
DYNAMIC_BATCH_KEYS = {"enable_batch_size_tuning", "enable_max_num_tokens_tuning", "dynamic_batch_moving_average_window"}
TOP_LEVEL_KEYS = {
    "model", "tokenizer", "backend", "max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width",
    "max_input_len", "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
    "moe_expert_parallel_size", "moe_cluster_parallel_size", "gpus_per_node", "enable_chunked_prefill",
    "enable_iter_perf_stats", "return_perf_metrics", "iter_stats_max_iterations", "request_stats_max_iterations",
    "perf_metrics_max_requests", "kv_cache_config", "scheduler_config", "cuda_graph_config", "enable_attention_dp",
    "disable_overlap_scheduler", "print_iter_log", "trust_remote_code", "dtype", "build_config", "revision",
    "stream_interval", "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser", "attn_backend",
    "sampler_type", "enable_autotuner", "torch_compile_config", "moe_config", "lora_config", "speculative_config",
    "guided_decoding_backend", "batch_wait_timeout_ms", "otlp_traces_endpoint", "load_format", "checkpoint_format",
    "skip_tokenizer_init", "fail_fast_on_attention_window_too_large", "enable_lora", "peft_cache_config",
    "cache_transceiver_config", "extended_runtime_perf_knob_config", "decoding_config", "quant_config",
    "calib_config", "garbage_collection_gen0_threshold", "cp_config", "custom_tokenizer", "enable_min_latency",
    "max_stats_len", "normalize_log_probs", "gather_generation_logits", "enable_prompt_adapter"}


# Fields only the PyTorch backend's TorchLlmArgs declares (llm_args.py); TrtLlmArgs forbids extra inputs.
TORCH_ONLY_KEYS = {"enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log", "attn_backend",
                   "sampler_type", "moe_config", "cuda_graph_config", "disable_overlap_scheduler",
                   "torch_compile_config", "enable_autotuner"}


class ServeError(ValueError):
    """trtllm-serve refuses to start (exit 1) with this message."""


class ServeUsageError(ServeError):
    """click refuses the command line (exit 2) with this message."""


@dataclass(frozen=True)
class ServeSettings:
    model: str
    model_id: str
    host: str
    port: int
    backend: str
    engine: EngineConfig
    profile_name: str
    speedup: float
    startup_s: float
    iter_perf_stats: bool
    return_perf_metrics: bool
    version: str = TRTLLM_VERSION
    release: Release | None = None
    perturbation: Perturbation = Perturbation()  # KVSIM_PERTURB, already applied to engine's profile
    warnings: tuple[str, ...] = ()  # logged at startup, as TensorRT-LLM's logger.warning would
    enable_autotuner: bool = True  # TorchLlmArgs.enable_autotuner: the kernel autotuner's warm-up (serve/warmup.py)


def cli_llm_args(args) -> dict[str, Any]:
    """What get_llm_args() builds from the command line."""
    return {
        "backend": args.backend, "max_batch_size": args.max_batch_size, "max_num_tokens": args.max_num_tokens,
        "max_seq_len": args.max_seq_len, "max_beam_width": args.max_beam_width,
        "tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "kv_cache_config": {"free_gpu_memory_fraction": args.free_gpu_memory_fraction},
        "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT", "dynamic_batch_config": {
            "enable_batch_size_tuning": True, "enable_max_num_tokens_tuning": False,
            "dynamic_batch_moving_average_window": 128}},
    }


def merge_yaml(llm_args: dict[str, Any], extra: dict[str, Any], source: str,
               release: Release | None = None) -> dict[str, Any]:
    """update_llm_args_with_extra_dict: YAML keys replace CLI values; sections replace whole sections. Keys are
    checked against the release's args classes (extra="forbid")."""
    release = release or resolve_release(None)
    if not isinstance(extra, dict):
        raise ServeError(f"{source}: the extra LLM API options must be a YAML mapping")
    allowed = TOP_LEVEL_KEYS
    tensorrt = extra.get("backend", llm_args.get("backend")) == "tensorrt"
    if tensorrt:
        allowed = TOP_LEVEL_KEYS - TORCH_ONLY_KEYS
        if not release.trt_has_perf_metrics_max_requests:
            allowed = allowed - {"perf_metrics_max_requests"}
    unknown = sorted(set(extra) - allowed)
    if unknown:
        backend = "TrtLlmArgs" if allowed is not TOP_LEVEL_KEYS else "LlmArgs"
        raise ServeError(f"{source}: {', '.join(unknown)}: Extra inputs are not permitted ({backend})")
    if tensorrt and extra.get("return_perf_metrics") and not release.trt_has_perf_metrics_max_requests:
        # The server reads llm.args.perf_metrics_max_requests whenever return_perf_metrics is set
        # (NVIDIA/TensorRT-LLM#9678, release:1.2.0rc2).
        raise ServeError("AttributeError: 'TrtLlmArgs' object has no attribute 'perf_metrics_max_requests'")
    _check_section(extra.get("kv_cache_config"), KV_CACHE_KEYS, f"{source}: kv_cache_config")
    scheduler = extra.get("scheduler_config")
    scheduler_keys = SCHEDULER_KEYS if release.waiting_queue_policy else SCHEDULER_KEYS - {"waiting_queue_policy"}
    _check_section(scheduler, scheduler_keys, f"{source}: scheduler_config")
    if isinstance(scheduler, dict) and scheduler.get("dynamic_batch_config") is not None:
        dyn = scheduler["dynamic_batch_config"]
        _check_section(dyn, DYNAMIC_BATCH_KEYS, f"{source}: scheduler_config.dynamic_batch_config")
        missing = sorted(DYNAMIC_BATCH_KEYS - set(dyn))
        if missing:
            raise ServeError(f"{source}: scheduler_config.dynamic_batch_config.{missing[0]}: Field required")
    return {**llm_args, **extra}


def _check_section(section: Any, allowed: set[str], where: str) -> None:
    if section is None:
        return
    if not isinstance(section, dict):
        raise ServeError(f"{where} must be a mapping")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ServeError(f"{where}.{unknown[0]}: Extra inputs are not permitted")


def resolve(args, environ: dict[str, str] | None = None) -> ServeSettings:
    """Everything trtllm-serve decides before loading the model; ServeError for anything it would refuse."""
    env = os.environ if environ is None else environ
    try:
        release = resolve_release(env.get("KVSIM_TRTLLM_RELEASE"))
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    perturbation = Perturbation.from_env(env)  # PerturbationError: the caller exits 2
    profile = perturbation.apply(_profile_from_env(env))
    llm_args = cli_llm_args(args)
    warnings: list[str] = []
    if args.extra_llm_api_options:
        path = Path(args.extra_llm_api_options)
        if not path.is_file():
            raise ServeError(f"--extra_llm_api_options file {path} does not exist")
        try:
            extra = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            mark = getattr(exc, "problem_mark", None)  # YAML's own message spans lines, with a caret drawing
            why = getattr(exc, "problem", None) or getattr(exc, "strerror", None) or type(exc).__name__
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ServeError(f"--extra_llm_api_options file {path} is not readable YAML: {why}{at}") from None
        llm_args = merge_yaml(llm_args, extra or {}, str(path), release)
    backend = llm_args.get("backend", args.backend)
    _check_backend(backend, args.backend, release)
    torch = backend != "tensorrt"  # pytorch, and _autodeploy played as pytorch
    kv = llm_args.get("kv_cache_config") or {}
    scheduler = llm_args.get("scheduler_config") or {}
    dyn = scheduler.get("dynamic_batch_config") or {}
    policy = CapacityPolicy.parse(scheduler.get("capacity_scheduler_policy", "GUARANTEED_NO_EVICT"))
    runtime_bs, runtime_nt = int(llm_args["max_batch_size"]), int(llm_args["max_num_tokens"])
    common: dict[str, Any] = dict(
        capacity_policy=policy, free_gpu_memory_fraction=float(kv.get("free_gpu_memory_fraction", 0.9)),
        kv_max_tokens=kv.get("max_tokens"), enable_block_reuse=bool(kv.get("enable_block_reuse", True)),
        enable_chunked_context=bool(llm_args.get("enable_chunked_prefill", False)),
        # dynamic_batch_config "only applies for the TensorRT backend" (llm_args.py field description)
        enable_batch_size_tuning=not torch and bool(dyn.get("enable_batch_size_tuning", False)),
        enable_max_num_tokens_tuning=not torch and bool(dyn.get("enable_max_num_tokens_tuning", False)),
        tuner_window=int(dyn.get("dynamic_batch_moving_average_window", 128)),
        iter_stats_max_iterations=int(llm_args.get("iter_stats_max_iterations") or 1000))
    model_path = Path(args.model)
    if is_engine_dir(model_path):
        if not release.tensorrt_backend:
            raise ServeError(f"{args.model} is a TensorRT engine directory, and TensorRT-LLM {release.version} has no "
                             "TensorRT backend (removed after 1.3.0rc20): serve the HF checkpoint with "
                             "--backend pytorch")
        if backend != "tensorrt":
            raise ServeError(f"{args.model} is a TensorRT engine directory: serve it with --backend tensorrt")
        try:
            engine = load_engine_dir(model_path)
        except ValueError as exc:  # a hand-edited or truncated config.json: one line naming the file and field
            raise ServeError(str(exc)) from None
        if runtime_bs > engine.max_batch_size:
            if not release.clamps_runtime_limits:  # 1.1
                raise ServeError(f"max_batch_size [{runtime_bs}] is greater than build_config.max_batch_size "
                                 f"[{engine.max_batch_size}] in build_config")
            # 1.2+: overridden with a warning; the message prints the engine value twice (it is formatted
            # after the assignment), as TensorRT-LLM's does.
            runtime_bs = engine.max_batch_size
            warnings.append(f"max_batch_size [{runtime_bs}] is overridden by build_config.max_batch_size "
                            f"[{engine.max_batch_size}] in build_config")
        if runtime_nt > engine.max_num_tokens:
            if not release.clamps_runtime_limits:
                raise ServeError(f"max_num_tokens [{runtime_nt}] is greater than build_config.max_num_tokens "
                                 f"[{engine.max_num_tokens}] in build_config")
            runtime_nt = engine.max_num_tokens
            warnings.append(f"max_num_tokens [{runtime_nt}] is overridden by build_config.max_num_tokens "
                            f"[{engine.max_num_tokens}] in build_config")
        config = EngineConfig(
            profile=engine.profile_on(profile), build_max_batch_size=engine.max_batch_size,
            build_max_num_tokens=engine.max_num_tokens, max_seq_len=engine.max_seq_len,
            max_input_len=engine.max_input_len, tokens_per_block=engine.tokens_per_block,
            kv_cache_type=engine.kv_cache_type, max_batch_size=runtime_bs, max_num_tokens=runtime_nt, **common)
        model_id = model_path.name
    else:
        if backend == "tensorrt" and model_path.exists():
            raise ServeError(f"{args.model} has no engine config.json with a build_config; build it with "
                             "trtllm-build (or serve an HF model with --backend pytorch)")
        base = profile
        ckpt = model_path / "config.json"
        if ckpt.is_file():
            try:
                base = _with_model(profile, model_spec_from_config(read_config_json(ckpt, "checkpoint config"),
                                                                   str(ckpt)))
            except ValueError as exc:
                raise ServeError(str(exc)) from None
        tp, pp = int(llm_args.get("tensor_parallel_size", 1)), int(llm_args.get("pipeline_parallel_size", 1))
        if (tp, pp) != (1, 1) or base.tp != 1:
            base = base.with_parallelism(tp if tp > 1 else base.tp, pp)
        max_seq_len = llm_args.get("max_seq_len") or base.model.max_position_embeddings
        config = EngineConfig(
            profile=base, build_max_batch_size=runtime_bs, build_max_num_tokens=runtime_nt,
            max_seq_len=int(max_seq_len), max_input_len=llm_args.get("max_input_len"),
            tokens_per_block=int(kv.get("tokens_per_block", 32)), kv_cache_type=KvCacheType.PAGED,
            max_batch_size=runtime_bs, max_num_tokens=runtime_nt, backend=Backend.PYTORCH if torch else Backend.TENSORRT,
            cuda_graphs=_cuda_graphs(llm_args), **common)
        model_id = args.model if not model_path.is_dir() else model_path.name
    try:
        config = config.resolved()
        plan_for(config)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    return ServeSettings(
        model=args.model, model_id=model_id, host=args.host, port=args.port, backend=backend, engine=config,
        profile_name=profile.name, speedup=_positive_float(env, "KVSIM_SPEEDUP", 1.0),
        startup_s=_positive_float(env, "KVSIM_STARTUP_SECONDS", 0.0, allow_zero=True),
        iter_perf_stats=bool(llm_args.get("enable_iter_perf_stats", backend == "tensorrt")),
        return_perf_metrics=bool(llm_args.get("return_perf_metrics", False)),
        version=release.version, release=release, perturbation=perturbation, warnings=tuple(warnings),
        enable_autotuner=torch and _flag(llm_args, "enable_autotuner", True))


def _flag(llm_args: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean LLM-API option (pydantic refuses anything else)."""
    value = llm_args.get(key, default)
    if not isinstance(value, bool):
        raise ServeError(f"{key}: Input should be a valid boolean, got {str(value)[:40]!r}")
    return value


def _check_backend(backend: Any, cli_backend: str, release: Release) -> None:
    """The played release's backends: click refuses a CLI value outside them (exit 2), the args class a YAML one."""
    if cli_backend not in release.backends:
        listed = ", ".join(f"'{c}'" for c in release.backends)
        raise ServeUsageError(f"Invalid value for '--backend': {cli_backend!r} is not one of {listed}.")
    if backend not in release.backends:
        listed = " or ".join(f"'{c}'" for c in release.backends)
        raise ServeError(f"backend: Input should be {listed} (TensorRT-LLM {release.version}), got {str(backend)[:40]!r}")


def _cuda_graphs(llm_args: dict[str, Any]) -> CudaGraphs | None:
    """cuda_graph_config: absent -> CudaGraphConfig() (graphs to 128); null -> off; a mapping -> validated."""
    if "cuda_graph_config" not in llm_args:
        return CudaGraphs()
    section = llm_args["cuda_graph_config"]
    if section is None:
        return None
    try:
        return CudaGraphs.from_llm_api(section)
    except CudaGraphConfigError as exc:
        raise ServeError(str(exc)) from None


def _with_model(profile: Profile, model) -> Profile:
    from dataclasses import replace

    return profile if model == profile.model else replace(profile, model=model, name=f"{model.name}-on-{profile.name}")


def _profile_from_env(env) -> Profile:
    name = env.get("KVSIM_PROFILE")
    if not name:
        raise ServeError("KVSIM_PROFILE is not set: kvsim's trtllm-serve needs a profile such as "
                         "KVSIM_PROFILE=llama-3.1-8b-fp8-h100 (see `kvsim profiles`)")
    try:
        return get_profile(name)
    except KeyError as exc:
        raise ServeError(f"KVSIM_PROFILE={name!r} is not a usable profile: {exc.args[0]}") from None


def _positive_float(env, name: str, default: float, allow_zero: bool = False) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ServeError(f"{name} must be a number, got {raw!r}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ServeError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {raw!r}")
    return value
