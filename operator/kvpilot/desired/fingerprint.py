"""The engine fingerprint: a hash of every input that changes the compiled engine or the prepared checkpoint.

Serving-only and batching-only fields are deliberately absent, so changing them never rebuilds (or re-prepares).
The image and the GPU product are present: TensorRT engines are not portable across TensorRT-LLM versions or GPUs,
and neither is the PyTorch kernel autotuner's cache a prepare Job keeps (it records the library version and the
device it was tuned on).
"""

from __future__ import annotations

import hashlib
import json

from kvpilot.api.models import InferenceEngineSpec


def fingerprint_inputs(spec: InferenceEngineSpec, image: str, ceiling: int) -> dict[str, object]:
    """Everything that affects the build, by name (also shown by ``kvpilot render`` for review)."""
    b = spec.build
    inputs: dict[str, object] = {
        "backend": spec.runtime.backend,
        "model.source": spec.model.source,
        "model.revision": spec.model.revision,
        "image": image,
        "gpuProduct": spec.serving.gpu_product,
    }
    if not spec.builds_engine:
        return inputs
    if spec.prepares_checkpoint:
        return {**inputs, **_prepare_inputs(spec)}
    inputs.update(
        {
            "model.architecture": spec.model.architecture,
            "build.dtype": b.dtype,
            "build.quantization": b.quantization,
            "build.kvCacheDtype": b.kv_cache_dtype,
            "build.tensorParallelSize": b.tensor_parallel_size,
            "build.pipelineParallelSize": b.pipeline_parallel_size,
            "build.maxBatchSize": ceiling,
            "build.maxInputLen": b.max_input_len,
            "build.maxSeqLen": b.max_seq_len,
            "build.maxNumTokens": b.max_num_tokens,
            "build.maxBeamWidth": b.max_beam_width,
            "build.kvCache.type": b.kv_cache.type,
            "build.kvCache.tokensPerBlock": b.kv_cache.tokens_per_block,
            "build.multipleProfiles": b.multiple_profiles,
        }
    )
    if b.quantization in ("fp8", "int4_awq", "nvfp4"):
        inputs["build.calibration"] = [b.calibration.dataset, b.calibration.size, b.calibration.max_seq_length]
    if spec.runtime.simulation is not None:
        inputs["simulation.profile"] = spec.runtime.simulation.profile
    return inputs


def compute_fingerprint(spec: InferenceEngineSpec, image: str, ceiling: int) -> str:
    canonical = json.dumps(fingerprint_inputs(spec, image, ceiling), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _prepare_inputs(spec: InferenceEngineSpec) -> dict[str, object]:
    """What a PyTorch prepare Job's result depends on: the quantization (and its calibration), and the ranks the
    warm-up tuned kernels for. Runtime limits (batching.*) are absent: the warm-up cache holds per-shape results,
    so another limit only tunes its missing shapes at start-up, never a new prepare."""
    b = spec.build
    inputs: dict[str, object] = {
        "prepare": "pytorch",
        "build.quantization": b.quantization,
        "build.kvCacheDtype": b.kv_cache_dtype,
        "build.tensorParallelSize": b.tensor_parallel_size,
        "build.pipelineParallelSize": b.pipeline_parallel_size,
    }
    if b.quantization != "none":
        inputs["build.dtype"] = b.dtype
        inputs["build.calibration"] = [b.calibration.dataset, b.calibration.size, b.calibration.max_seq_length]
    if spec.runtime.simulation is not None:
        inputs["simulation.profile"] = spec.runtime.simulation.profile
        inputs["simulation.backend"] = spec.runtime.simulation.backend
    return inputs
