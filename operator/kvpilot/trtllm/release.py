"""Facts about the TensorRT-LLM release images kvpilot targets (1.2.1 by default; the rows in options/releases.yaml).

Sources are cited in docs/trtllm-sources.md and docs/trtllm-releases.md; the values here are what the renderers use.
"""

from __future__ import annotations

from kvpilot.api import reserved_env

# The latest stable release (PyPI tensorrt-llm 1.2.1, 2026-04-20; tensorrtllm_backend pins release/1.2.1). It still
# has the TensorRT backend (deprecated); 1.3.0rc21 and later have only PyTorch.
DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
# Where NVIDIA's release image keeps the example scripts (convert_checkpoint.py, quantize.py).
EXAMPLES_DIR = "/app/tensorrt_llm/examples"

# Checkpoint converter per model family (1.x tree: examples/models/core/<family>/). Mistral and Mixtral
# checkpoints go through the Llama converter, as NVIDIA's Mixtral README does.
CONVERTERS = {
    "llama": "models/core/llama/convert_checkpoint.py",
    "mistral": "models/core/llama/convert_checkpoint.py",
    "mixtral": "models/core/llama/convert_checkpoint.py",
    "qwen": "models/core/qwen/convert_checkpoint.py",
    "gemma": "models/core/gemma/convert_checkpoint.py",
}
QUANTIZE_SCRIPT = "quantization/quantize.py"

# ModelOpt formats of quantize.py for kvpilot's quantization names.
QFORMATS = {"fp8": "fp8", "int4_awq": "int4_awq", "nvfp4": "nvfp4", "int8_weight_only": "int8_wo",
            "none": "full_prec"}

# LLM-API names of the capacity scheduler policies.
SCHEDULER_POLICIES = {
    "GuaranteedNoEvict": "GUARANTEED_NO_EVICT",
    "MaxUtilization": "MAX_UTILIZATION",
    "static": "STATIC_BATCH",
}

# TensorRT-LLM's own DynamicBatchConfig window (requests) when the in-engine tuner is on.
DYNAMIC_BATCH_WINDOW = 128

# Where the PyTorch kernel autotuner reads and writes its cache (every row of options/releases.yaml agrees; read in
# tensorrt_llm/_torch/pyexecutor/model_engine.py `_run_autotuner_warmup`). A release that lacks it ignores it.
AUTOTUNER_CACHE_ENV = reserved_env.TLLM_AUTOTUNER_CACHE_PATH  # runtime.env may not set it (api/reserved_env.py)
