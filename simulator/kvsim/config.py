"""Engine configuration: the build-time ceiling, the runtime limits and the scheduler/KV-cache options.

Names follow TensorRT-LLM: ``build_*`` fields are what ``trtllm-build`` bakes into the engine (they size the
activation buffers and therefore the KV pool); the runtime fields are what ``trtllm-serve`` / the LLM API pass
(``max_batch_size`` must not exceed the engine's, exactly as TensorRT-LLM refuses it).

``backend`` is the execution backend kvsim plays: ``tensorrt`` (a built engine: the C++ executor's per-slot
buffers, the in-engine batch tuner, the batch-size fields of the iteration stats) or ``pytorch`` (no build: the
KV pool is carved after a memory-estimation pass, CUDA graphs for decode batches, no in-engine tuner, and the
iteration stats' batch-size fields stay 0, as ``PyExecutor`` never sets them). On ``pytorch`` the ``build_*``
fields are the runtime limits (there is no engine to build).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from .cuda_graphs import CudaGraphs
from .profiles import Profile, get_profile


class CapacityPolicy(str, Enum):
    """TensorRT-LLM's ``CapacitySchedulerPolicy``."""

    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    MAX_UTILIZATION = "MAX_UTILIZATION"
    STATIC_BATCH = "STATIC_BATCH"

    @classmethod
    def parse(cls, value: str | CapacityPolicy) -> CapacityPolicy:
        if isinstance(value, CapacityPolicy):
            return value
        normalized = str(value).strip().upper().replace("-", "_")
        aliases = {"GUARANTEEDNOEVICT": "GUARANTEED_NO_EVICT", "MAXUTILIZATION": "MAX_UTILIZATION",
                   "STATICBATCH": "STATIC_BATCH", "STATIC": "STATIC_BATCH"}
        normalized = aliases.get(normalized.replace("_", ""), normalized)
        try:
            return cls(normalized)
        except ValueError:
            raise ValueError(
                f"scheduler_config.capacity_scheduler_policy must be one of "
                f"{[p.value for p in cls]}, got {value!r}"
            ) from None


class Backend(str, Enum):
    """``--backend`` of trtllm-serve that kvsim plays."""

    TENSORRT = "tensorrt"
    PYTORCH = "pytorch"


class KvCacheType(str, Enum):
    """``paged`` is TensorRT-LLM's default; ``continuous`` reserves max_seq_len per request (the comparison)."""

    PAGED = "paged"
    CONTINUOUS = "continuous"


@dataclass(frozen=True)
class EngineConfig:
    """Everything an ``Engine`` needs. ``None`` runtime limits mean "the engine's build value"."""

    profile: Profile | str = "llama-3.1-8b-fp8-h100"
    # build-time ceiling (trtllm-build)
    build_max_batch_size: int = 2048
    build_max_num_tokens: int = 8192
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    max_input_len: int | None = None  # None: max_seq_len - 1
    tokens_per_block: int = 32
    kv_cache_type: KvCacheType = KvCacheType.PAGED
    # runtime (trtllm-serve / LLM API)
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    capacity_policy: CapacityPolicy = CapacityPolicy.GUARANTEED_NO_EVICT
    free_gpu_memory_fraction: float = 0.9
    kv_max_tokens: int | None = None
    enable_block_reuse: bool = True
    enable_chunked_context: bool = False
    enable_batch_size_tuning: bool = False  # trtllm-serve turns it on; the API leaves it to the caller
    enable_max_num_tokens_tuning: bool = False
    tuner_window: int = 128
    iter_stats_max_iterations: int = 1000
    backend: Backend = Backend.TENSORRT
    cuda_graphs: CudaGraphs | None = CudaGraphs()  # PyTorch only: CudaGraphConfig's default (max 128); None: off

    def resolved(self) -> EngineConfig:
        """A copy with the profile looked up, defaults filled in and every constraint checked."""
        profile = get_profile(self.profile) if isinstance(self.profile, str) else self.profile
        max_seq_len = self.max_seq_len or profile.model.max_position_embeddings
        cfg = replace(
            self,
            profile=profile,
            max_seq_len=max_seq_len,
            max_input_len=self.max_input_len or max_seq_len - 1,
            max_batch_size=self.max_batch_size if self.max_batch_size is not None else self.build_max_batch_size,
            max_num_tokens=self.max_num_tokens if self.max_num_tokens is not None else self.build_max_num_tokens,
            capacity_policy=CapacityPolicy.parse(self.capacity_policy),
            kv_cache_type=KvCacheType(self.kv_cache_type),
            backend=Backend(self.backend),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError naming the field and what must hold (TensorRT-LLM's wording where it has one)."""
        tpb = self.tokens_per_block
        if tpb < 2 or tpb & (tpb - 1):
            raise ValueError(f"tokens_per_block must be a power of two greater than 1, got {tpb}")
        for name in ("build_max_batch_size", "build_max_num_tokens", "max_batch_size", "max_num_tokens",
                     "max_seq_len", "max_input_len", "tuner_window", "iter_stats_max_iterations"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {value}")
        assert self.max_batch_size is not None and self.max_num_tokens is not None
        if self.max_batch_size > self.build_max_batch_size:
            raise ValueError(
                f"max_batch_size [{self.max_batch_size}] is greater than build_config.max_batch_size "
                f"[{self.build_max_batch_size}] in build_config"
            )
        if self.max_num_tokens > self.build_max_num_tokens:
            raise ValueError(
                f"max_num_tokens [{self.max_num_tokens}] is greater than build_config.max_num_tokens "
                f"[{self.build_max_num_tokens}] in build_config"
            )
        if self.max_input_len is not None and self.max_seq_len is not None and self.max_input_len > self.max_seq_len:
            raise ValueError(f"max_input_len ({self.max_input_len}) must be <= max_seq_len ({self.max_seq_len})")
        if not 0.0 < self.free_gpu_memory_fraction <= 1.0:
            raise ValueError(
                f"kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {self.free_gpu_memory_fraction}"
            )
        if self.backend is Backend.PYTORCH and (self.enable_batch_size_tuning or self.enable_max_num_tokens_tuning):
            raise ValueError("scheduler_config.dynamic_batch_config: the in-engine batch tuner exists only on the "
                             "TensorRT backend (enable_batch_size_tuning / enable_max_num_tokens_tuning must be off)")
        if self.enable_chunked_context and self.max_num_tokens < tpb:
            raise ValueError(f"max_num_tokens ({self.max_num_tokens}) must be >= tokens_per_block ({tpb}) "
                             "with chunked context")

    @property
    def resolved_profile(self) -> Profile:
        return get_profile(self.profile) if isinstance(self.profile, str) else self.profile
