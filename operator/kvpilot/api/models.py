"""Typed, immutable models of the InferenceEngine spec.

Field names are the snake_case of the API's camelCase. Fields that the schema defaults are plain types;
fields the user may leave out are ``Optional``. ``tests/unit/test_api_parity.py`` proves these classes and
``spec_schema.py`` agree field for field, so neither can grow a field the other lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from kvpilot.api.convert import from_dict
from kvpilot.api.enums import TUNER_MAX_DEFAULT


@dataclass(frozen=True)
class SecretRef:
    name: str


@dataclass(frozen=True)
class ModelSpec:
    source: str
    revision: Optional[str] = None
    architecture: Optional[str] = None
    credentials_secret_ref: Optional[SecretRef] = None

    @property
    def scheme(self) -> str:
        """hf, pvc or s3."""
        return self.source.split("://", 1)[0]

    @property
    def location(self) -> str:
        """The source without its scheme: ``org/name``, ``claim/path`` or ``bucket/prefix``."""
        return self.source.split("://", 1)[1]


@dataclass(frozen=True)
class Simulation:
    profile: str
    speedup_ratio: int
    startup_seconds: int
    build_seconds: int
    backend: str = "tensorrt"  # the TensorRT-LLM backend kvsim plays: tensorrt (an engine) or pytorch


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: Optional[str] = None


@dataclass(frozen=True)
class RuntimeSpec:
    backend: str
    image: Optional[str] = None
    simulation: Optional[Simulation] = None
    run_as_user: Optional[int] = None
    run_as_group: Optional[int] = None
    env: tuple[EnvVar, ...] = ()


@dataclass(frozen=True)
class KvCacheSpec:
    type: str
    tokens_per_block: int


@dataclass(frozen=True)
class Calibration:
    dataset: str
    size: int
    max_seq_length: int


@dataclass(frozen=True)
class Resources:
    requests: Optional[dict[str, str]] = None
    limits: Optional[dict[str, str]] = None


@dataclass(frozen=True)
class BuildSpec:
    dtype: str
    quantization: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int
    kv_cache: KvCacheSpec
    multiple_profiles: bool
    calibration: Calibration
    timeout_seconds: int
    backoff_limit: int
    resources: Resources

    @property
    def gpus(self) -> int:
        """GPUs one engine instance needs: one per tensor-parallel x pipeline-parallel rank."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class BatchingSpec:
    mode: str
    max_batch_size: int
    max_num_tokens: int
    scheduler_policy: str
    kv_cache_free_gpu_memory_percent: int
    enable_block_reuse: bool
    enable_chunked_context: bool
    dynamic_batch_size_tuning: bool


@dataclass(frozen=True)
class Toleration:
    key: Optional[str] = None
    operator: Optional[str] = None
    value: Optional[str] = None
    effect: Optional[str] = None
    toleration_seconds: Optional[int] = None


@dataclass(frozen=True)
class RolloutSpec:
    max_surge: int
    max_unavailable: int
    strategy: str = "Auto"  # Auto | Surge | NoSurge (desired/rollout.py)


@dataclass(frozen=True)
class ServingSpec:
    replicas: int
    port: int
    resources: Resources
    startup_timeout_seconds: int
    rollout: RolloutSpec
    gpus_per_node: int = 8
    gpu_product: Optional[str] = None
    node_selector: Optional[dict[str, str]] = None
    tolerations: tuple[Toleration, ...] = ()
    priority_class_name: Optional[str] = None


@dataclass(frozen=True)
class EngineCacheSpec:
    access_mode: str
    claim_name: Optional[str] = None
    storage_class_name: Optional[str] = None
    size: Optional[str] = None


@dataclass(frozen=True)
class SloSpec:
    time_to_first_token_millis: Optional[int] = None
    time_per_output_token_millis: Optional[int] = None


@dataclass(frozen=True)
class MetricsSpec:
    source: str
    url: Optional[str] = None


@dataclass(frozen=True)
class AutotuneSpec:
    enabled: bool
    mode: str
    min_batch_size: int
    target_kv_cache_utilization_percent: int
    interval_seconds: int
    cooldown_seconds: int
    warmup_seconds: int
    allow_rebuild: bool
    metrics: MetricsSpec
    slo: Optional[SloSpec] = None
    canary: str = "Off"  # Auto | Always | Off: a change proposed for a gain tried on one pod first (canary_pass.py)
    # Absent from the spec: the larger of TUNER_MAX_DEFAULT and the start, derived by parse_spec, the only way a
    # spec is built (a bare from_dict would keep 1024 here), so a start above 1024 is within the tuner's bounds,
    # not a value it must clamp at once with a rolling restart.
    max_batch_size: int = TUNER_MAX_DEFAULT


@dataclass(frozen=True)
class InferenceEngineSpec:
    model: ModelSpec
    runtime: RuntimeSpec
    build: BuildSpec
    batching: BatchingSpec
    serving: ServingSpec
    autotune: AutotuneSpec
    engine_cache: Optional[EngineCacheSpec] = None

    @property
    def trtllm_backend(self) -> str:
        """The TensorRT-LLM backend that serves: ``tensorrt`` (an engine) or ``pytorch`` (the checkpoint); the
        simulated backend plays ``runtime.simulation.backend``."""
        if self.runtime.backend == "simulated":
            return self.runtime.simulation.backend if self.runtime.simulation is not None else "tensorrt"
        return self.runtime.backend

    @property
    def prepares_checkpoint(self) -> bool:
        """A PyTorch engine whose checkpoint a Job prepares once into the engine cache (fetch, optional ModelOpt
        quantization, warm-up cache), the counterpart of the TensorRT build."""
        return self.trtllm_backend == "pytorch" and self.engine_cache is not None

    @property
    def builds_engine(self) -> bool:
        """A Job makes what serves, and serving waits for it: a TensorRT engine (tensorrt, simulated) or a prepared
        checkpoint (pytorch with an engine cache). Only pytorch without a cache serves the checkpoint directly."""
        return self.runtime.backend != "pytorch" or self.engine_cache is not None

    @property
    def nodes_per_replica(self) -> int:
        """Nodes one replica spans: 1, or (TP x PP) / serving.gpusPerNode when its ranks exceed one node
        (admission makes the division exact)."""
        gpus, per_node = self.build.gpus, self.serving.gpus_per_node
        return 1 if gpus <= per_node else gpus // per_node

    @property
    def gpus_per_pod(self) -> int:
        """GPUs one pod holds: every rank's, or one node's worth for a multi-node engine (its serving pods and its
        build, which trtllm-build --workers runs over the node's GPUs for all ranks)."""
        return min(self.build.gpus, self.serving.gpus_per_node)

    @property
    def multinode(self) -> bool:
        """Served by a LeaderWorkerSet (a group of pods per replica) instead of a Deployment."""
        return self.nodes_per_replica > 1


@dataclass(frozen=True)
class ObjectRef:
    """Identity of the InferenceEngine the children are derived from (for names and owner references)."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)  # requests to the operator (retry-build)


@dataclass(frozen=True)
class InferenceEngine:
    meta: ObjectRef
    spec: InferenceEngineSpec


def parse_spec(spec: dict[str, object]) -> InferenceEngineSpec:
    """Build the typed spec from a *defaulted and validated* spec dict.

    ``autotune.maxBatchSize`` has no schema default: a CRD default cannot depend on another field, and a fixed
    1024 would clamp the recommended start (TensorRT-LLM's own default, 2048; docs/autotune-guide.md) at once,
    one rolling restart before the tuner has measured anything. Absent, it is the larger of 1024 and the start."""
    parsed = from_dict(InferenceEngineSpec, spec)
    tuning = spec.get("autotune")
    if isinstance(tuning, dict) and "maxBatchSize" in tuning:
        return parsed
    bound = max(TUNER_MAX_DEFAULT, parsed.batching.max_batch_size)
    return replace(parsed, autotune=replace(parsed.autotune, max_batch_size=bound))
