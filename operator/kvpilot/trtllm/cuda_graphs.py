"""The CUDA graphs the PyTorch backend captures for what kvpilot renders (``serve.cuda_graph_config``), so the
tuner can price a change of the limit: each captured size costs start-up time and GPU memory carved before the
KV pool (autotune/costs.py holds the prices).

From NVIDIA/TensorRT-LLM (index file versions, no release tag confirmed):

- ``CudaGraphConfig._generate_cuda_graph_batch_sizes`` (tensorrt_llm/llmapi/llm_args.py, ids 1090804222 and
  7019226376): with ``enable_padding`` the sizes are 1, 2, 4, 8, 16, ..., 128 (steps of 8), then every power of two
  from 256 below the maximum (``range(8, ceil(log2(max)))``), then the maximum itself; all at most the maximum.
  A later file (id 55143598664, ``DecodeCudaGraphConfig``) steps by 64 above 128 instead of by powers of two, so
  it captures more graphs above 256; which release made that change was not read, and it is not modelled here.
- ``_filter_cuda_graph_batch_sizes`` (tensorrt_llm/_torch/pyexecutor/model_engine.py, ids 707893322 and
  3514536498): the engine keeps sizes at most min(max_batch_size, max_num_tokens) (no draft tokens here), which
  is the maximum kvpilot renders anyway.
"""

from __future__ import annotations

import math

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm.serve import cuda_graph_config

PADDED_SIZES = (1, 2, 4, *range(8, 129, 8))  # the padded ladder up to 128


def generated_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The sizes TensorRT-LLM generates from ``max_batch_size`` with padding (the 1.2-era rule above)."""
    top = max(1, max_batch_size)
    powers = [2**i for i in range(8, math.ceil(math.log2(top)))] if top > 1 else []
    sizes = sorted(s for s in (*PADDED_SIZES, *powers) if s <= top)
    return tuple(sizes if sizes and sizes[-1] == top else [*sizes, top])


def captured_batch_sizes(limit: int, max_num_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes a PyTorch pod captures at runtime limit ``limit``, as kvpilot renders its graphs."""
    config = cuda_graph_config(limit, max_num_tokens)
    cap = min(limit, max_num_tokens)
    return tuple(s for s in generated_batch_sizes(config["max_batch_size"]) if s <= max(1, cap))


def graph_token_cap(spec: InferenceEngineSpec) -> int:
    """The max_num_tokens that caps the CUDA graphs an engine's pods capture (serve.llm_api_options renders
    cuda_graph_config on the PyTorch backend only, up to min(limit, max_num_tokens)); 0 on TensorRT: no graphs."""
    return spec.batching.max_num_tokens if spec.trtllm_backend == "pytorch" else 0
