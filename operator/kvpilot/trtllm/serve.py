"""Renders ``trtllm-serve`` and its LLM-API YAML (``--extra_llm_api_options``).

``trtllm-serve`` always gets an explicit ``--max_batch_size`` at most the engine's: its CLI default (2048)
makes it refuse to start on any engine built with a smaller ceiling. In 1.2 the YAML overrides the CLI and
replaces whole sub-objects (``kv_cache_config``), so the YAML repeats every value the CLI sets: both say
the same thing, whichever wins. Each backend gets only what it uses: the in-engine batch-size tuner
(``scheduler_config.dynamic_batch_config``) only on TensorRT, CUDA graphs (``cuda_graph_config``) only on PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm import release
from kvpilot.trtllm import surface as surfaces
from kvpilot.trtllm.backend import KVSIM_DEFAULT_RELEASE, KVSIM_RELEASE_ENV, kvsim_release, kvsim_row, refusal
from kvpilot.trtllm.build import CACHE_MOUNT, MODEL_MOUNT, Command
from kvpilot.trtllm.surface import Surface

__all__ = ["KVSIM_DEFAULT_RELEASE", "KVSIM_RELEASE_ENV", "ServedEngine", "llm_api_options", "serve_command",
           "serving_surface"]

CONFIG_DIR = "/etc/kvpilot"
PYTORCH_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default (options/llm_api_options.yaml)
CONFIG_FILE = "llm-api.yaml"


@dataclass(frozen=True)
class ServedEngine:
    """What serving needs to know about the engine in service (from status.engine or the spec)."""

    fingerprint: str
    max_batch_size: int
    max_num_tokens: int
    tensor_parallel_size: int
    pipeline_parallel_size: int

    @property
    def engine_dir(self) -> str:
        return f"{CACHE_MOUNT}/{self.fingerprint}/engine"

    @property
    def tokenizer_dir(self) -> str:
        return f"{CACHE_MOUNT}/{self.fingerprint}/tokenizer"

    @property
    def checkpoint_dir(self) -> str:
        """The checkpoint a prepare Job published (PyTorch backend: fetched, optionally quantized)."""
        return f"{CACHE_MOUNT}/{self.fingerprint}/checkpoint"


def scheduler_policy(spec: InferenceEngineSpec) -> str:
    if spec.batching.mode == "static":
        return release.SCHEDULER_POLICIES["static"]
    return release.SCHEDULER_POLICIES[spec.batching.scheduler_policy]


def kv_fraction(spec: InferenceEngineSpec) -> float:
    return round(spec.batching.kv_cache_free_gpu_memory_percent / 100, 2)


def runtime_limits(spec: InferenceEngineSpec, engine: ServedEngine | None, max_batch_size: int) -> tuple[int, int]:
    """Runtime max_batch_size and max_num_tokens, clamped to the engine's ceilings (never above them)."""
    if engine is None:
        return max_batch_size, spec.batching.max_num_tokens
    return min(max_batch_size, engine.max_batch_size), min(spec.batching.max_num_tokens, engine.max_num_tokens)


def backend_name(spec: InferenceEngineSpec) -> str:
    """trtllm-serve's --backend: the simulated backend plays runtime.simulation.backend."""
    return spec.trtllm_backend


def cuda_graph_config(batch: int, tokens: int) -> dict[str, Any]:
    """CUDA graphs captured up to the runtime limit, with padding.

    Without this key every release captures batches up to 128 only (CudaGraphConfig: "If neither is provided, a
    default max_batch_size of 128 is used"), so a limit above 128 decodes its larger batches eagerly. Given
    ``max_batch_size``, TensorRT-LLM generates the sizes itself; the engine keeps those at most min(max_batch_size,
    max_num_tokens) (no draft tokens here), so that is the largest worth asking for. ``enable_padding`` rounds a
    batch up to the next captured size ("usually a net win for performance", the field's own description) and
    captures fewer graphs (1, 2, 4, then steps of 8 to 128, then powers of two): less capture time and memory
    than the 31 sizes below 32 without it. Sources: options/releases.yaml (cuda_graph_config_keys)."""
    return {"max_batch_size": max(1, min(batch, tokens)), "enable_padding": True}


def llm_api_options(
    spec: InferenceEngineSpec, engine: ServedEngine | None, max_batch_size: int, surface: Surface | None = None
) -> dict[str, Any]:
    """The LLM-API YAML: runtime batching, KV-cache pool, scheduler policy, and the stats kvpilot reads.

    ``surface`` is the serving image's release surface (unknown: the conservative one). Every key rendered is
    one that release's args class accepts for the backend: the schema is strict, an extra key is a crash loop."""
    surface = surface or surfaces.get(surfaces.CONSERVATIVE)
    backend = backend_name(spec)
    batch, tokens = runtime_limits(spec, engine, max_batch_size)
    paged = spec.build.kv_cache.type == "paged"  # block reuse and chunked context need paged blocks
    kv_cache: dict[str, Any] = {
        "free_gpu_memory_fraction": kv_fraction(spec),
        "enable_block_reuse": spec.batching.enable_block_reuse and paged,
    }
    if backend == "pytorch" and spec.build.kv_cache_dtype != "auto":
        kv_cache["dtype"] = spec.build.kv_cache_dtype  # the TensorRT backend bakes it into the engine
    if backend == "pytorch" and spec.build.kv_cache.tokens_per_block != PYTORCH_TOKENS_PER_BLOCK:
        kv_cache["tokens_per_block"] = spec.build.kv_cache.tokens_per_block  # likewise (KvCacheConfig's default: 32)
    scheduler: dict[str, Any] = {"capacity_scheduler_policy": scheduler_policy(spec)}
    if backend == "tensorrt":
        # The in-engine batch-size tuner: "only applies for the TensorRT backend and cannot currently be used with
        # the PyTorch backend" (SchedulerConfig.dynamic_batch_config, llm_args.py id 7019226376).
        scheduler["dynamic_batch_config"] = {
            "enable_batch_size_tuning": spec.batching.dynamic_batch_size_tuning,
            "enable_max_num_tokens_tuning": False,
            "dynamic_batch_moving_average_window": release.DYNAMIC_BATCH_WINDOW,
        }
    options: dict[str, Any] = {
        "max_batch_size": batch,
        "max_num_tokens": tokens,
        "enable_chunked_prefill": spec.batching.enable_chunked_context and paged,
        "kv_cache_config": kv_cache,
        "scheduler_config": scheduler,
    }
    if backend == "pytorch" and surface.cuda_graph_keys >= {"max_batch_size", "enable_padding"}:
        options["cuda_graph_config"] = cuda_graph_config(batch, tokens)
    # Perf metrics mount /prometheus/metrics (latency histograms). On 1.2's TensorRT backend the server then reads
    # TrtLlmArgs.perf_metrics_max_requests, which does not exist there: startup fails (NVIDIA/TensorRT-LLM#9678),
    # so it is rendered only where the release has the field. Iteration stats (/metrics, the tuner's primary
    # input) are on by default in the TensorRT backend and must be asked for in the PyTorch one.
    if surface.renders_return_perf_metrics(backend):
        options["return_perf_metrics"] = True
    if backend == "pytorch":
        options["enable_iter_perf_stats"] = True
    return options


def rejected_keys(options: dict[str, Any], surface: Surface, backend: str) -> list[str]:
    """Rendered keys the release would refuse (tests hold this empty for every release and backend)."""
    return [key for key in _dotted_keys(options) if not surface.accepts_key(backend, key)]


def _dotted_keys(options: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in options.items():
        out.append(prefix + key)
        if isinstance(value, dict) and prefix.count(".") < 1:
            out += _dotted_keys(value, f"{prefix}{key}.")
    return out


def model_argument(spec: InferenceEngineSpec, engine: ServedEngine | None) -> list[str]:
    """The positional MODEL: the engine directory (with its tokenizer), the prepared checkpoint, or (pytorch
    without an engine cache) the checkpoint as the spec names it."""
    if engine is not None and spec.prepares_checkpoint:
        return [served_checkpoint(spec, engine)]
    if engine is not None and spec.builds_engine:
        return [engine.engine_dir, "--tokenizer", engine.tokenizer_dir]
    model = spec.model
    if model.scheme == "hf":
        args = [model.location]
        if model.revision:
            args += ["--revision", model.revision]
        return args
    if model.scheme == "pvc":
        return [f"{MODEL_MOUNT}/{model.location.partition('/')[2]}".rstrip("/")]
    return [f"{MODEL_MOUNT}"]  # s3: synced into the model volume by an init container


def serve_command(
    spec: InferenceEngineSpec, engine: ServedEngine | None, max_batch_size: int
) -> Command:
    batch, tokens = runtime_limits(spec, engine, max_batch_size)
    tp = engine.tensor_parallel_size if engine else spec.build.tensor_parallel_size
    pp = engine.pipeline_parallel_size if engine else spec.build.pipeline_parallel_size
    backend = backend_name(spec)
    argv = [
        "trtllm-serve",
        *model_argument(spec, engine),
        "--backend", backend,
        "--host", "0.0.0.0",
        "--port", str(spec.serving.port),
        "--max_batch_size", str(batch),
        "--max_num_tokens", str(tokens),
        "--kv_cache_free_gpu_memory_fraction", str(kv_fraction(spec)),
        "--tp_size", str(tp),
        "--pp_size", str(pp),
        "--extra_llm_api_options", f"{CONFIG_DIR}/{CONFIG_FILE}",
    ]
    if backend == "pytorch":
        argv += ["--max_seq_len", str(spec.build.max_seq_len)]
    return Command("trtllm-serve", tuple(argv))


def served_checkpoint(spec: InferenceEngineSpec, engine: ServedEngine) -> str:
    """What a prepared PyTorch engine serves: the checkpoint the Job published, or a pvc:// checkpoint in place
    (mounted read-only) when the Job had nothing to fetch or quantize."""
    model = spec.model
    if model.scheme == "pvc" and spec.build.quantization == "none" and spec.runtime.backend != "simulated":
        return f"{MODEL_MOUNT}/{model.location.partition('/')[2]}".rstrip("/")
    return engine.checkpoint_dir


def serving_surface(
    spec: InferenceEngineSpec, image: str, recorded: dict[str, Any] | None
) -> tuple[Surface, str, str | None]:
    """The surface to render for, how it was known ("recorded", "tag", "kvsim", "unknown", or "refused" when the
    engine cannot run there), and a message: what the build Job recorded contradicting the release the image tag
    names, or why the engine is refused (a TensorRT engine on a release without the TensorRT backend)."""
    if spec.runtime.backend == "simulated":
        surface = surfaces.get(kvsim_row(kvsim_release(spec)))
        refused = refusal(spec, image, surface)
        return surface, ("refused" if refused else "kvsim"), refused
    surface, mismatch = surfaces.effective(image, recorded)
    refused = refusal(spec, image, surface)
    if refused:
        return surface, "refused", refused
    if surfaces.release_of_probe(recorded) is not None:
        how = "recorded"
    else:
        how = "tag" if surface.release not in (surfaces.CONSERVATIVE, surfaces.NEWER) else "unknown"
    return surface, how, mismatch
