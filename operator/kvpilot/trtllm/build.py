"""Renders the engine build: download -> checkpoint conversion or quantization -> trtllm-build -> publish.

The build Job runs one readable bash script made of these commands, so ``kubectl get job -o yaml`` shows
the exact ``trtllm-build`` invocation. The engine is built in a staging directory on the cache volume and
published with one atomic ``mv -T`` next to a small JSON manifest: a half-built engine is never visible
under its fingerprint, and a builder that finds the manifest already there exits at once (cache hit).
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from kvpilot.api.enums import MAX_BUILD_SECONDS
from kvpilot.api.models import BuildSpec, InferenceEngineSpec
from kvpilot.trtllm import release

CACHE_MOUNT = "/engines"
MODEL_MOUNT = "/model"
MANIFEST = "kvpilot-engine.json"
TERMINATION_LOG = "/dev/termination-log"
STAGE_VAR = "$STAGE"  # set by the build script to the staging directory
# No build Job outlives the largest deadline admission allows, so a staging directory untouched for longer
# (plus an hour) belongs to a pod that died without running its cleanup trap (SIGKILL, a lost node).
ORPHAN_AFTER_MINUTES = MAX_BUILD_SECONDS // 60 + 60


class StagePath(str):
    """A path under the staging directory, written ``$STAGE/<rest>``: the one kind of argument bash expands.

    A type, not a prefix test, marks it: a spec value that merely starts with ``$STAGE`` is quoted like
    any other (issue 13: ``$STAGE$(touch x)`` as a calibration dataset ran ``touch``).
    """

    def __new__(cls, rest: str) -> "StagePath":
        return super().__new__(cls, f"{STAGE_VAR}/{rest}")

    def shell(self) -> str:
        return f'"{STAGE_VAR}"/' + shlex.quote(self[len(STAGE_VAR) + 1:])


def quote(arg: str) -> str:
    """One argument as bash must read it: stage paths expand ``$STAGE`` only, everything else is literal."""
    return arg.shell() if isinstance(arg, StagePath) else shlex.quote(arg)


@dataclass(frozen=True)
class Command:
    """One process invocation; ``tool`` names the parser whose options its flags must come from."""

    tool: str
    argv: tuple[str, ...]

    def shell(self) -> str:
        """The command as one shell line; no spec value is ever left unquoted."""
        return " ".join(quote(a) for a in self.argv)


@dataclass(frozen=True)
class BuildPaths:
    """Where each stage of one build lives inside the build pod."""

    fingerprint: str
    model_dir: str

    @property
    def final(self) -> str:
        return f"{CACHE_MOUNT}/{self.fingerprint}"

    @property
    def staging_root(self) -> str:
        return f"{CACHE_MOUNT}/.staging"

    @property
    def stage(self) -> str:
        # $HOSTNAME is the pod name: two pods of the same Job never share a staging directory.
        return f"{self.staging_root}/{self.fingerprint}-$HOSTNAME"

    @property
    def checkpoint(self) -> str:
        return StagePath("checkpoint")

    @property
    def engine(self) -> str:
        return StagePath("engine")


def manifest_base(spec: InferenceEngineSpec, fingerprint: str, image: str) -> dict[str, object]:
    """What every published engine or prepared checkpoint says about itself (read back into status.engine)."""
    b = spec.build
    return {
        "fingerprint": fingerprint,
        "image": image,
        "model": {"source": spec.model.source, "revision": spec.model.revision},
        "backend": spec.runtime.backend,
        "maxSeqLen": b.max_seq_len,
        "tokensPerBlock": b.kv_cache.tokens_per_block,
        "tensorParallelSize": b.tensor_parallel_size,
        "pipelineParallelSize": b.pipeline_parallel_size,
        "quantization": b.quantization,
        "kvCacheDtype": b.kv_cache_dtype,
    }


def model_cache_key(source: str, revision: str | None) -> str:
    """Downloads are kept per source+revision, so a second engine of the same model skips the download."""
    return hashlib.sha256(f"{source}@{revision or ''}".encode()).hexdigest()[:16]


def model_dir(spec: InferenceEngineSpec) -> str:
    model = spec.model
    if model.scheme == "pvc":
        _claim, _, path = model.location.partition("/")
        return f"{MODEL_MOUNT}/{path}".rstrip("/")
    return f"{CACHE_MOUNT}/.models/{model_cache_key(model.source, model.revision)}"


def hf_download(spec: InferenceEngineSpec, dest: str) -> Command:
    """Download a pinned Hugging Face snapshot with huggingface_hub (shipped in the release image)."""
    code = (
        "import os, sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], "
        "token=os.environ.get(\"HF_TOKEN\"))"
    )
    return Command("python", ("python3", "-c", code, spec.model.location, spec.model.revision or "main", dest))


def gemm_plugin(build: BuildSpec) -> str:
    """NVIDIA: the GEMM plugin helps FP16/BF16 and should be disabled for FP8 (useful-build-time-flags.md);
    NVFP4 engines use the nvfp4 GEMM plugin (NVIDIA/TensorRT-Model-Optimizer @ 2017cd90 :
    examples/llm_ptq/modelopt_to_tensorrt_llm.py)."""
    return {"fp8": "disable", "nvfp4": "nvfp4"}.get(build.quantization, "auto")


def uses_quantize_script(build: BuildSpec) -> bool:
    """ModelOpt (quantize.py) handles calibrated formats and every quantized KV cache."""
    return build.quantization in ("fp8", "int4_awq", "nvfp4") or build.kv_cache_dtype != "auto"


def calibrates(spec: InferenceEngineSpec) -> bool:
    """Whether the Job reads a calibration set: quantize.py for a TensorRT engine; ModelOpt for a prepared PyTorch
    checkpoint, whose KV-cache dtype is a runtime setting (kv_cache_config.dtype) that needs none."""
    if spec.runtime.backend == "simulated":
        return False
    if spec.trtllm_backend == "pytorch":
        return spec.build.quantization in ("fp8", "nvfp4")
    return uses_quantize_script(spec.build)


def convert(spec: InferenceEngineSpec, paths: BuildPaths) -> Command:
    """Checkpoint conversion (per architecture) or ModelOpt quantization; TP/PP are fixed here."""
    b = spec.build
    examples = release.EXAMPLES_DIR
    if uses_quantize_script(b):
        argv = [
            "python3", f"{examples}/{release.QUANTIZE_SCRIPT}",
            "--model_dir", paths.model_dir,
            "--output_dir", paths.checkpoint,
            "--dtype", b.dtype,
            "--qformat", release.QFORMATS[b.quantization],
            "--calib_dataset", calibration_dataset(spec),
            "--calib_size", str(b.calibration.size),
            "--calib_max_seq_length", str(b.calibration.max_seq_length),
            "--tp_size", str(b.tensor_parallel_size),
            "--pp_size", str(b.pipeline_parallel_size),
        ]
        if b.kv_cache_dtype != "auto":
            argv += ["--kv_cache_dtype", b.kv_cache_dtype]
        return Command("quantize", tuple(argv))
    arch = spec.model.architecture or "llama"
    script = f"{examples}/{release.CONVERTERS[arch]}"
    if arch == "gemma":
        argv = [
            "python3", script,
            "--ckpt-type", "hf",
            "--model-dir", paths.model_dir,
            "--output-model-dir", paths.checkpoint,
            "--dtype", b.dtype,
            "--world-size", str(b.gpus),
        ]
        if b.quantization == "int8_weight_only":
            argv += ["--use_weight_only", "--weight_only_precision", "int8"]
        return Command("convert_checkpoint_gemma", tuple(argv))
    argv = [
        "python3", script,
        "--model_dir", paths.model_dir,
        "--output_dir", paths.checkpoint,
        "--dtype", b.dtype,
        "--tp_size", str(b.tensor_parallel_size),
        "--pp_size", str(b.pipeline_parallel_size),
    ]
    if b.quantization == "int8_weight_only":
        argv += ["--use_weight_only", "--weight_only_precision", "int8"]
    tool = "convert_checkpoint_qwen" if arch == "qwen" else "convert_checkpoint_llama"
    return Command(tool, tuple(argv))


CALIBRATION_MOUNT = "/calibration"


def calibration_dataset(spec: InferenceEngineSpec) -> str:
    """A pvc:// dataset is read from its claim, mounted read-only at /calibration (air-gapped clusters)."""
    dataset = spec.build.calibration.dataset
    if dataset.startswith("pvc://"):
        return f"{CALIBRATION_MOUNT}/{dataset.removeprefix('pvc://').partition('/')[2]}".rstrip("/")
    return dataset


def simulated_checkpoint(spec: InferenceEngineSpec, paths: BuildPaths) -> Command:
    """kvsim writes a weightless TensorRT-LLM checkpoint for the profile (stands in for conversion)."""
    assert spec.runtime.simulation is not None
    b = spec.build
    return Command(
        "kvsim_checkpoint",
        (
            "kvsim", "checkpoint",
            "--profile", spec.runtime.simulation.profile,
            "--output_dir", paths.checkpoint,
            "--tp_size", str(b.tensor_parallel_size),
            "--pp_size", str(b.pipeline_parallel_size),
        ),
    )


def trtllm_build(build: BuildSpec, paths: BuildPaths, max_batch_size: int) -> Command:
    """trtllm-build with in-flight batching expressed by real flags: a paged KV cache, packed input
    (remove_input_padding) and the GPT attention plugin; paged context FMHA enables chunked context and
    block reuse. TensorRT-LLM has no flag that switches in-flight batching on (see options/trtllm_build.yaml, not_options)."""
    paged = build.kv_cache.type == "paged"
    argv = [
        "trtllm-build",
        "--checkpoint_dir", paths.checkpoint,
        "--output_dir", paths.engine,
        "--max_batch_size", str(max_batch_size),
        "--max_input_len", str(build.max_input_len),
        "--max_seq_len", str(build.max_seq_len),
        "--max_num_tokens", str(build.max_num_tokens),
        "--max_beam_width", str(build.max_beam_width),
        "--kv_cache_type", build.kv_cache.type,
        "--tokens_per_block", str(build.kv_cache.tokens_per_block),
        "--remove_input_padding", "enable",
        "--gpt_attention_plugin", "auto",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable" if paged else "disable",
        "--multiple_profiles", "enable" if build.multiple_profiles else "disable",
        "--gemm_plugin", gemm_plugin(build),
        "--workers", str(build.gpus),
    ]
    return Command("trtllm-build", tuple(argv))
