"""Schema sections for what is built: model, runtime and build (the fingerprint's inputs)."""

from __future__ import annotations

from kvpilot.api.openapi import (
    DNS1123_SUBDOMAIN,
    Rule,
    Schema,
    boolean,
    integer,
    obj,
    resources,
    string,
)
from kvpilot.api.enums import (
    ARCHITECTURES,
    BACKENDS,
    DTYPES,
    KV_CACHE_DTYPES,
    MAX_BATCH,
    MAX_BUILD_SECONDS,
    MAX_TOKENS,
    QUANTIZATIONS,
    SIMULATION_PROFILES,
)
from kvpilot.api import patterns as P
from kvpilot.api.release_tags import PYTORCH_ONLY_KVSIM_REGEX, PYTORCH_ONLY_TAG_REGEX
from kvpilot.api.schema_env import env_schema


def model_schema() -> Schema:
    return obj(
        "Which model to serve and where its weights come from.",
        {
            "source": string(
                "Where the Hugging Face checkpoint lives: hf://<org>/<name> (downloaded), pvc://<claim>/<path> "
                "(a directory on an existing PersistentVolumeClaim) or s3://<bucket>/<prefix>.",
                max_length=1024,
                rules=(P.matches(P.SOURCE_REGEX, P.SOURCE_MESSAGE),),
            ),
            "revision": string(
                "The commit (or tag) of the checkpoint. It pins the weights an engine is built from, so it is "
                "required for hf:// sources; a new revision builds a new engine.",
                max_length=256,
                rules=(P.matches(P.REVISION_REGEX, P.REVISION_MESSAGE),),
            ),
            "architecture": string(
                "The model family; it selects TensorRT-LLM's checkpoint converter. Required for backend tensorrt. "
                "llama also covers Llama-derived checkpoints; mistral uses the llama converter.",
                enum=ARCHITECTURES,
            ),
            "credentialsSecretRef": obj(
                "A Secret in the same namespace with the download credentials. Only these keys are read, each by "
                "name (never the whole Secret): HF_TOKEN for hf:// sources; AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY (and optionally AWS_SESSION_TOKEN, AWS_REGION) for s3://.",
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


def runtime_schema() -> Schema:
    return obj(
        "How the model runs: the TensorRT-LLM backend and image.",
        {
            "backend": string(
                "tensorrt builds an engine with trtllm-build and serves it (TensorRT-LLM 1.3.0rc20 and earlier: later "
                "releases have no TensorRT backend); pytorch serves the checkpoint, prepared once into the engine "
                "cache by a Job when engineCache is set; simulated runs the same Jobs and pods with kvsim, kvpilot's "
                "simulator of the engine (no GPU).",
                enum=BACKENDS,
                default="tensorrt",
            ),
            "image": string(
                "The TensorRT-LLM image that builds (or prepares) and serves (the same image for both: engines and "
                "warm-up caches are not portable across TensorRT-LLM versions). Defaults to "
                "nvcr.io/nvidia/tensorrt-llm/release:1.2.1, or to the operator's kvsim image for backend simulated.",
                max_length=512,
                rules=(P.matches(P.IMAGE_REGEX, P.IMAGE_MESSAGE),),
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
                    "buildSeconds": integer("Simulated engine build (or checkpoint prepare) time.", 0, 86400,
                                            default=0),
                    "backend": string(
                        "The TensorRT-LLM backend kvsim plays: tensorrt (a build Job runs kvsim's trtllm-build) or "
                        "pytorch (a prepare Job writes the checkpoint and warm-up cache; refused nowhere, and the "
                        "only one on releases without the TensorRT backend).",
                        enum=("tensorrt", "pytorch"),
                        default="tensorrt",
                    ),
                },
                required=("profile",),
            ),
            "runAsUser": integer(
                "Non-root user ID the build and serving containers run as. NVIDIA's TensorRT-LLM release image "
                "declares no USER and runs as root (uid 0), so kvpilot only forces a non-root user for its kvsim "
                "image (uid 10001); set this for an image that runs as (or tolerates) a non-root user. The pods "
                "then also get runAsNonRoot and an fsGroup so the user can write the engine cache.",
                1,
                2147483647,
                fmt="int64",
            ),
            "runAsGroup": integer(
                "Group ID for runAsUser (defaults to runAsUser); also the pods' fsGroup.",
                1,
                2147483647,
                fmt="int64",
            ),
            "env": env_schema(),
        },
        default={},
    )


def build_schema() -> Schema:
    return obj(
        "What the TensorRT-LLM engine is compiled for. Every field here is part of the engine's fingerprint: "
        "changing one builds a new engine while the previous one keeps serving.",
        {
            "dtype": string("Activation and weight precision before quantization.", enum=DTYPES, default="bfloat16"),
            "quantization": string(
                "Weight quantization. tensorrt: fp8, int4_awq and nvfp4 run NVIDIA ModelOpt calibration (quantize.py); "
                "int8_weight_only is applied during checkpoint conversion. pytorch: fp8 or nvfp4, quantized once by "
                "the prepare Job with NVIDIA ModelOpt into a checkpoint the PyTorch backend loads (needs "
                "engineCache); or none for a checkpoint that is already quantized.",
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
                        rules=(P.matches(P.DATASET_REGEX, P.DATASET_MESSAGE),),
                    ),
                    "size": integer("Number of calibration samples (--calib_size).", 1, 100000, default=512),
                    "maxSeqLength": integer(
                        "Sequence length of calibration samples (--calib_max_seq_length).", 1, 131072, default=512
                    ),
                },
                default={},
            ),
            "timeoutSeconds": integer(
                "Deadline of one build Job (activeDeadlineSeconds).", 60, MAX_BUILD_SECONDS, default=7200
            ),
            "backoffLimit": integer("Retries of a failed build pod before the build fails.", 0, 10, default=2),
            "resources": resources("CPU and memory of the build container (GPUs follow the parallel sizes)."),
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


# A PyTorch engine, real or played by kvsim (the rules below hold for both).
_PYTORCH = ("(self.runtime.backend == 'pytorch' || (self.runtime.backend == 'simulated' && "
            "has(self.runtime.simulation) && self.runtime.simulation.backend == 'pytorch'))")
_SIM_TENSORRT = ("self.runtime.backend == 'simulated' && has(self.runtime.simulation) && "
                 "self.runtime.simulation.backend == 'tensorrt'")
_REMOVED = ("TensorRT-LLM removed trtllm-build and --backend tensorrt after 1.3.0rc20 (docs/migration-pytorch.md)")

# Spec-wide rules about the backend and the release (spec_schema.SPEC_RULES adds them). The release rules read the
# image tag or kvsim's KVSIM_TRTLLM_RELEASE; the operator refuses the same engines when only its default image or
# a Job's probe names the release (trtllm/backend.py).
BACKEND_RULES = (
    Rule(
        f"!{_PYTORCH} || (self.build.quantization in ['none', 'fp8', 'nvfp4'] && "
        "(self.build.quantization == 'none' || has(self.engineCache)) && self.build.kvCacheDtype != 'int8')",
        "build.quantization must be none, fp8 or nvfp4 for backend pytorch (fp8 and nvfp4 are quantized once by the "
        "prepare Job with NVIDIA ModelOpt, so they need engineCache; none serves the checkpoint as it is, e.g. one "
        "already quantized), and build.kvCacheDtype auto or fp8 (its KV cache takes no int8)",
        ".build",
    ),
    Rule(
        f"self.runtime.backend != 'tensorrt' || !has(self.runtime.image) || "
        f"!self.runtime.image.matches('{PYTORCH_ONLY_TAG_REGEX}')",
        f"runtime.image names a TensorRT-LLM release without the TensorRT backend: {_REMOVED}; set "
        "runtime.backend: pytorch",
        ".runtime.image",
        message_expression=(
            "'runtime.image ' + self.runtime.image + ' is a TensorRT-LLM release without the TensorRT backend: "
            f"{_REMOVED}; set runtime.backend: pytorch'"),
    ),
    Rule(
        f"!({_SIM_TENSORRT}) || !has(self.runtime.env) || !self.runtime.env.exists(e, "
        f"e.name == 'KVSIM_TRTLLM_RELEASE' && has(e.value) && e.value.matches('{PYTORCH_ONLY_KVSIM_REGEX}'))",
        f"runtime.env KVSIM_TRTLLM_RELEASE names a TensorRT-LLM release without the TensorRT backend, so kvsim "
        f"cannot play a TensorRT engine there: {_REMOVED}; set runtime.simulation.backend: pytorch",
        ".runtime.simulation.backend",
    ),
)
