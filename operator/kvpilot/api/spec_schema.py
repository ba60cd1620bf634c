"""The OpenAPI schema of ``InferenceEngine.spec``: every field, its description, default, bounds and rules.

This is the single definition of the user-facing API. ``kvpilot crd`` renders it into the CRD in ``crds/``;
``kvpilot render`` validates and defaults manifests against it offline; ``tests/unit/test_api_parity.py``
proves the typed models in ``models.py`` agree with it field for field.
"""

from __future__ import annotations

from kvpilot.api.openapi import (
    DNS1123_SUBDOMAIN,
    Rule,
    Schema,
    array,
    boolean,
    expand_object_defaults,
    integer,
    obj,
    quantity,
    quantity_map,
    string,
    string_map,
)

ARCHITECTURES = ("llama", "mistral", "mixtral", "qwen", "gemma")
BACKENDS = ("tensorrt", "pytorch", "simulated")
DTYPES = ("float16", "bfloat16")
QUANTIZATIONS = ("none", "fp8", "int4_awq", "int8_weight_only", "nvfp4")
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
SCHEDULER_POLICIES = ("GuaranteedNoEvict", "MaxUtilization")
SIMULATION_PROFILES = (
    "llama-3.1-8b-fp8-h100",
    "llama-3.1-8b-bf16-h100",
    "llama-3.1-8b-bf16-a100",
    "llama-3.1-8b-fp8-h200",
    "llama-3.1-70b-fp8-h100-tp2",
    "llama-3.1-70b-fp8-h100-tp4",
    "llama-3.1-70b-fp8-h200",
)
TOKENS_PER_BLOCK_CHOICES = (2, 4, 8, 16, 32, 64, 128)
MAX_BATCH = 16384
MAX_TOKENS = 1048576

SOURCE_REGEX = r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/.*)?)$"


def _model() -> Schema:
    return obj(
        "Which model to serve and where its weights come from.",
        {
            "source": string(
                "Where the Hugging Face checkpoint lives: hf://<org>/<name> (downloaded), pvc://<claim>/<path> "
                "(a directory on an existing PersistentVolumeClaim) or s3://<bucket>/<prefix>.",
                max_length=1024,
                rules=(
                    Rule(
                        f"self.matches('{SOURCE_REGEX}')",
                        "must be hf://<org>/<name>, pvc://<claim>/<path> or s3://<bucket>/<prefix>",
                    ),
                ),
            ),
            "revision": string(
                "The commit (or tag) of the checkpoint. It pins the weights an engine is built from, so it is "
                "required for hf:// sources; a new revision builds a new engine.",
                max_length=256,
                pattern=r"^[-A-Za-z0-9_./]+$",
            ),
            "architecture": string(
                "The model family; it selects TensorRT-LLM's checkpoint converter. Required for backend tensorrt. "
                "llama also covers Llama-derived checkpoints; mistral uses the llama converter.",
                enum=ARCHITECTURES,
            ),
            "credentialsSecretRef": obj(
                "A Secret in the same namespace whose keys become environment variables of the download step: "
                "HF_TOKEN for hf:// sources; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_REGION) for s3://.",
                {"name": string("Name of the Secret.", pattern=DNS1123_SUBDOMAIN)},
                required=("name",),
            ),
        },
        required=("source",),
        rules=(
            Rule(
                "!self.source.startsWith('hf://') || has(self.revision)",
                "revision must be set for hf:// sources: it pins the weights an engine is built from",
                ".revision",
            ),
        ),
    )


def _runtime() -> Schema:
    return obj(
        "How the model runs: the TensorRT-LLM backend and image.",
        {
            "backend": string(
                "tensorrt builds an engine with trtllm-build and serves it; pytorch serves the checkpoint with no "
                "build; simulated runs the same Jobs and pods with kvsim, kvpilot's simulator of the engine (no GPU).",
                enum=BACKENDS,
                default="tensorrt",
            ),
            "image": string(
                "The TensorRT-LLM image that builds and serves (the same image for both: engines are not portable "
                "across TensorRT-LLM versions). Defaults to nvcr.io/nvidia/tensorrt-llm/release:1.2.0, or to the "
                "operator's kvsim image for backend simulated.",
                max_length=512,
            ),
            "simulation": obj(
                "Settings of the simulated backend (kvsim). Required when backend is simulated.",
                {
                    "profile": string(
                        "The simulated model and GPU, named <model>-<dtype>-<gpu>[-tpN].", enum=SIMULATION_PROFILES
                    ),
                    "speedupRatio": integer(
                        "How much faster than real time the simulated engine runs (1 = real time).",
                        1,
                        10000,
                        default=1,
                    ),
                    "startupSeconds": integer(
                        "Simulated model-load time before /health answers.", 0, 3600, default=0
                    ),
                    "buildSeconds": integer("Simulated engine build time.", 0, 86400, default=0),
                },
                required=("profile",),
            ),
            "env": array(
                "Extra environment variables for the build and serving containers (e.g. NCCL_DEBUG, HF_HUB_OFFLINE).",
                obj(
                    "An environment variable.",
                    {
                        "name": string("Variable name.", max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"),
                        "value": string("Variable value.", max_length=4096),
                    },
                    required=("name",),
                ),
                max_items=64,
            ),
        },
        default={},
    )


def _build() -> Schema:
    return obj(
        "What the TensorRT-LLM engine is compiled for. Every field here is part of the engine's fingerprint: "
        "changing one builds a new engine while the previous one keeps serving.",
        {
            "dtype": string("Activation and weight precision before quantization.", enum=DTYPES, default="bfloat16"),
            "quantization": string(
                "Weight quantization. fp8, int4_awq and nvfp4 run NVIDIA ModelOpt calibration (quantize.py); "
                "int8_weight_only is applied during checkpoint conversion.",
                enum=QUANTIZATIONS,
                default="none",
            ),
            "kvCacheDtype": string(
                "Precision of the KV cache. fp8 halves its memory (about twice the blocks); auto keeps dtype.",
                enum=KV_CACHE_DTYPES,
                default="auto",
            ),
            "tensorParallelSize": integer(
                "GPUs a layer is split across (set at checkpoint conversion).", 1, 64, default=1
            ),
            "pipelineParallelSize": integer("Pipeline stages (set at checkpoint conversion).", 1, 64, default=1),
            "maxBatchSize": integer(
                "The engine's ceiling on concurrent requests (trtllm-build --max_batch_size). The runtime "
                "batching.maxBatchSize can move up to it without a rebuild; a higher ceiling costs activation "
                "memory and therefore KV-cache blocks.",
                1,
                MAX_BATCH,
                default=512,
            ),
            "maxInputLen": integer("Longest prompt in tokens (--max_input_len).", 1, MAX_TOKENS, default=4096),
            "maxSeqLen": integer(
                "Longest sequence, prompt plus output, in tokens (--max_seq_len; it replaced --max_output_len).",
                2,
                MAX_TOKENS,
                default=8192,
            ),
            "maxNumTokens": integer(
                "Most tokens batched in one iteration after padding removal (--max_num_tokens).",
                1,
                MAX_TOKENS,
                default=8192,
            ),
            "maxBeamWidth": integer("Beam-search width ceiling (--max_beam_width).", 1, 32, default=1),
            "kvCache": obj(
                "The KV-cache layout compiled into the engine.",
                {
                    "type": string(
                        "paged: a pool of fixed-size blocks that requests take and give back (required for "
                        "in-flight batching); continuous: one contiguous max-length region per request.",
                        enum=("paged", "continuous"),
                        default="paged",
                    ),
                    "tokensPerBlock": integer(
                        "Tokens per KV-cache block (--tokens_per_block): a power of two from 2 to 128. Smaller "
                        "blocks waste less of the last block; larger ones cost less bookkeeping.",
                        2,
                        128,
                        default=32,
                        rules=(
                            Rule(
                                "self in [2, 4, 8, 16, 32, 64, 128]",
                                "must be a power of two between 2 and 128",
                            ),
                        ),
                    ),
                },
                default={},
            ),
            "multipleProfiles": boolean(
                "Build several TensorRT optimization profiles (--multiple_profiles enable); NVIDIA advises it always.",
                default=True,
            ),
            "calibration": obj(
                "Calibration data for fp8, int4_awq and nvfp4 quantization.",
                {
                    "dataset": string(
                        "A Hugging Face dataset name, or a path under the model source for air-gapped clusters "
                        "(e.g. pvc://datasets/cnn_dailymail).",
                        max_length=1024,
                        default="cnn_dailymail",
                    ),
                    "size": integer("Number of calibration samples (--calib_size).", 1, 100000, default=512),
                    "maxSeqLength": integer(
                        "Sequence length of calibration samples (--calib_max_seq_length).", 1, 131072, default=512
                    ),
                },
                default={},
            ),
            "timeoutSeconds": integer(
                "Deadline of one build Job (activeDeadlineSeconds).", 60, 172800, default=7200
            ),
            "backoffLimit": integer("Retries of a failed build pod before the build fails.", 0, 10, default=2),
            "resources": _resources("CPU and memory of the build container (GPUs follow the parallel sizes)."),
        },
        default={},
        rules=(
            Rule(
                "self.maxInputLen < self.maxSeqLen",
                "maxInputLen must be < maxSeqLen (maxSeqLen counts prompt plus output tokens)",
                ".maxInputLen",
            ),
        ),
    )


def _batching() -> Schema:
    return obj(
        "Runtime batching of trtllm-serve. Changing these rolls the pods; it never rebuilds the engine.",
        {
            "mode": string(
                "inflight: requests join and leave the batch every iteration (continuous batching); static: a "
                "batch runs to completion before the next is admitted (TensorRT-LLM STATIC_BATCH).",
                enum=("inflight", "static"),
                default="inflight",
            ),
            "maxBatchSize": integer(
                "The runtime max_batch_size to start from (at most build.maxBatchSize). When autotune runs in "
                "Auto mode the value in force is status.batching.maxBatchSize.",
                1,
                MAX_BATCH,
                default=64,
            ),
            "maxNumTokens": integer(
                "Runtime token budget per iteration (at most build.maxNumTokens).", 1, MAX_TOKENS, default=8192
            ),
            "schedulerPolicy": string(
                "GuaranteedNoEvict reserves every admitted request's blocks to completion, so a started request is "
                "never paused; MaxUtilization packs more requests and pauses the newest when blocks run out.",
                enum=SCHEDULER_POLICIES,
                default="GuaranteedNoEvict",
            ),
            "kvCacheFreeGpuMemoryPercent": integer(
                "Share of the GPU memory left after weights and activations that the KV-cache pool takes.",
                1,
                100,
                default=90,
            ),
            "enableBlockReuse": boolean("Reuse KV-cache blocks of shared prompt prefixes.", default=True),
            "enableChunkedContext": boolean(
                "Split long prompts over several iterations (chunked prefill).", default=True
            ),
            "dynamicBatchSizeTuning": boolean(
                "TensorRT-LLM's in-engine tuner (dynamic_batch_config.enable_batch_size_tuning); it can only lower "
                "the effective batch size below the runtime maxBatchSize.",
                default=True,
            ),
        },
        default={},
    )


def _resources(description: str) -> Schema:
    return obj(
        description,
        {
            "requests": quantity_map("Minimum resources, e.g. cpu: 8, memory: 64Gi."),
            "limits": quantity_map("Maximum resources."),
        },
        default={},
    )


def _serving() -> Schema:
    toleration = obj(
        "A toleration, as in a Pod spec.",
        {
            "key": string("Taint key.", max_length=316),
            "operator": string("Exists or Equal.", enum=("Exists", "Equal")),
            "value": string("Taint value.", max_length=63),
            "effect": string("Taint effect.", enum=("NoSchedule", "PreferNoSchedule", "NoExecute")),
            "tolerationSeconds": integer("How long a NoExecute taint is tolerated.", 0, None, fmt="int64"),
        },
    )
    return obj(
        "The pods that serve the engine with trtllm-serve's OpenAI-compatible API.",
        {
            "replicas": integer(
                "Serving pods; each takes tensorParallelSize x pipelineParallelSize GPUs. Also reachable through "
                "the scale subresource (kubectl scale, HPA, KEDA).",
                0,
                1000,
                default=1,
            ),
            "gpuProduct": string(
                "GPU model to run on: the node label nvidia.com/gpu.product (e.g. NVIDIA-H100-80GB-HBM3). Builds run "
                "on it too, because engines are GPU-specific; it is part of the fingerprint.",
                max_length=128,
                pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$",
            ),
            "port": integer("Port of the OpenAI-compatible HTTP API.", 1, 65535, default=8000),
            "resources": _resources("CPU and memory of each serving pod (GPUs follow the parallel sizes)."),
            "nodeSelector": string_map("Extra node labels the pods require.", 32, 253),
            "tolerations": array("Tolerations of the serving and build pods.", toleration, 32),
            "priorityClassName": string("PriorityClass of the serving pods.", pattern=DNS1123_SUBDOMAIN),
            "startupTimeoutSeconds": integer(
                "How long a pod may take to load the model before it is restarted (the startupProbe budget).",
                10,
                86400,
                default=1800,
            ),
            "rollout": obj(
                "Rolling-update limits. The default (maxSurge 0, maxUnavailable 1) needs no spare GPU: it stops one "
                "old pod before starting its replacement.",
                {
                    "maxSurge": integer("Extra pods allowed during a rollout.", 0, 1000, default=0),
                    "maxUnavailable": integer("Pods that may be down during a rollout.", 0, 1000, default=1),
                },
                default={},
                rules=(
                    Rule(
                        "self.maxSurge + self.maxUnavailable >= 1",
                        "maxSurge and maxUnavailable must not both be 0: a rollout could never progress",
                    ),
                ),
            ),
        },
        default={},
    )


def _engine_cache() -> Schema:
    return obj(
        "The volume engines are cached on, each under its fingerprint, so the same engine is never built twice. "
        "Name an existing claim, or give a size (and storage class) for one the operator creates.",
        {
            "claimName": string(
                "An existing PersistentVolumeClaim, or the name of the one to create when size is set "
                "(default <name>-engines).",
                pattern=DNS1123_SUBDOMAIN,
            ),
            "storageClassName": string("StorageClass of the claim the operator creates.", pattern=DNS1123_SUBDOMAIN),
            "size": quantity("Size of the claim the operator creates, e.g. 200Gi."),
            "accessMode": string(
                "Access mode of the claim the operator creates; ReadWriteMany lets pods on several nodes share it.",
                enum=("ReadWriteOnce", "ReadWriteMany"),
                default="ReadWriteMany",
            ),
        },
        rules=(
            Rule(
                "has(self.claimName) || has(self.size)",
                "engineCache must name an existing claim (claimName) or ask for a new one (size)",
            ),
        ),
    )


def _autotune() -> Schema:
    return obj(
        "Retuning of the runtime maxBatchSize from the KV-cache pool the operator observes.",
        {
            "enabled": boolean("Observe the pods and decide.", default=True),
            "mode": string(
                "Auto applies decisions (a rolling restart, never a spec change); Advisory only records them in "
                "status.autotune.",
                enum=("Auto", "Advisory"),
                default="Advisory",
            ),
            "minBatchSize": integer("Lowest runtime maxBatchSize the tuner may set.", 1, MAX_BATCH, default=8),
            "maxBatchSize": integer(
                "Highest runtime maxBatchSize the tuner may set (also bounded by the engine's ceiling).",
                1,
                MAX_BATCH,
                default=1024,
            ),
            "targetKvCacheUtilizationPercent": integer(
                "KV-cache pool utilization (used/max blocks) to aim for at peak.", 1, 100, default=85
            ),
            "intervalSeconds": integer("How often the pods' metrics are read.", 5, 3600, default=30),
            "cooldownSeconds": integer(
                "Minimum time between two applied changes (each one restarts the pods).", 0, 86400, default=600
            ),
            "warmupSeconds": integer(
                "Metrics of a pod younger than this are ignored (cold caches mislead).", 0, 3600, default=60
            ),
            "allowRebuild": boolean(
                "May raise the engine's ceiling (build.maxBatchSize in force) through a new build when the gain "
                "outweighs the build and restart cost.",
                default=False,
            ),
            "slo": obj(
                "Latency objectives; the tuner lowers the batch size rather than break them.",
                {
                    "timeToFirstTokenMillis": integer("Time to first token objective.", 1, 600000),
                    "timePerOutputTokenMillis": integer("Time per output token objective.", 1, 60000),
                },
            ),
            "metrics": obj(
                "Where the KV-cache metrics come from.",
                {
                    "source": string(
                        "Pod: each pod's trtllm-serve /metrics (iteration stats); Prometheus: a Prometheus server.",
                        enum=("Pod", "Prometheus"),
                        default="Pod",
                    ),
                    "url": string(
                        "Base URL of the Prometheus server (for source Prometheus).",
                        max_length=2048,
                        pattern=r"^https?://",
                    ),
                },
                default={},
                rules=(
                    Rule(
                        "self.source != 'Prometheus' || has(self.url)",
                        "url must be set when source is Prometheus",
                        ".url",
                    ),
                ),
            ),
        },
        default={},
        rules=(
            Rule(
                "self.minBatchSize <= self.maxBatchSize",
                "minBatchSize must be <= maxBatchSize",
                ".minBatchSize",
            ),
        ),
    )


SPEC_RULES = (
    Rule(
        "self.runtime.backend != 'pytorch' || (self.build.quantization == 'none' && self.build.kvCacheDtype != 'int8')",
        "build.quantization must be none and build.kvCacheDtype auto or fp8 for backend pytorch: it serves the "
        "checkpoint as it is (use a pre-quantized checkpoint) and its KV cache takes no int8",
        ".build",
    ),
    Rule(
        "!has(self.model.architecture) || self.model.architecture != 'gemma' || "
        "self.build.pipelineParallelSize == 1",
        "build.pipelineParallelSize must be 1 for gemma: its checkpoint converter supports tensor parallelism only",
        ".build.pipelineParallelSize",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || self.batching.maxBatchSize <= self.build.maxBatchSize",
        "batching.maxBatchSize must be <= build.maxBatchSize (the engine's ceiling): trtllm-serve refuses a larger "
        "runtime value",
        ".batching.maxBatchSize",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || self.batching.maxNumTokens <= self.build.maxNumTokens",
        "batching.maxNumTokens must be <= build.maxNumTokens",
        ".batching.maxNumTokens",
    ),
    Rule(
        "self.batching.mode != 'inflight' || self.build.kvCache.type == 'paged'",
        "in-flight batching (batching.mode inflight) requires a paged KV cache (build.kvCache.type paged)",
        ".build.kvCache.type",
    ),
    Rule(
        "self.batching.enableChunkedContext || self.build.maxInputLen <= self.batching.maxNumTokens",
        "without chunked context, build.maxInputLen must be <= batching.maxNumTokens (a prompt is one iteration)",
        ".batching.enableChunkedContext",
    ),
    Rule(
        "self.runtime.backend != 'tensorrt' || has(self.model.architecture)",
        "model.architecture must be set for backend tensorrt: it selects the checkpoint converter",
        ".model",
    ),
    Rule(
        "self.runtime.backend != 'simulated' || has(self.runtime.simulation)",
        "runtime.simulation must be set when runtime.backend is simulated",
        ".runtime",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || has(self.engineCache)",
        "engineCache must be set for backends that build an engine (tensorrt, simulated)",
    ),
)


def spec_schema() -> Schema:
    """The full ``spec`` schema."""
    schema = obj(
        "The desired model, engine, serving pods and tuning. kvpilot never writes spec: tuned values live in status.",
        {
            "model": _model(),
            "runtime": _runtime(),
            "build": _build(),
            "batching": _batching(),
            "serving": _serving(),
            "engineCache": _engine_cache(),
            "autotune": _autotune(),
        },
        required=("model",),
        rules=SPEC_RULES,
    )
    return expand_object_defaults(schema)
