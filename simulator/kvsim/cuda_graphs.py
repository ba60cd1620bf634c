"""CUDA graphs on the PyTorch backend: which decode batches replay a captured graph, what the rest cost, and
what capturing costs in GPU memory and start-up time.

From NVIDIA/TensorRT-LLM (index file versions; no release tag could be confirmed, see docs/kvsim/README.md):

- ``CudaGraphConfig`` and ``TorchLlmArgs.validate_cuda_graph_config`` (tensorrt_llm/llmapi/llm_args.py, the
  1.2-era file, index id 1090804222): ``batch_sizes``, ``max_batch_size`` (default 0, must be >= 0) and
  ``enable_padding`` (default false); the field defaults to ``CudaGraphConfig()`` and ``cuda_graph_config: null``
  turns graphs off (``use_cuda_graph=bool(self.cuda_graph_config is not None)``). Given ``batch_sizes`` alone,
  the maximum is their largest; given both, the sizes must equal the generated ones ("Please don't set both
  cuda_graph_config.batch_sizes and cuda_graph_config.max_batch_size."); given neither, the maximum is 128.
  Generated sizes: 1-31, 32, 64, 128 (with padding 1, 2, 4, 8, 16, ..., 128), powers of two from 256 below the
  maximum, then the maximum.
- ``_filter_cuda_graph_batch_sizes`` (tensorrt_llm/_torch/pyexecutor/model_engine.py, index id 707893322): the
  engine captures only sizes up to ``min(max_batch_size, max_num_tokens)``; with padding, a larger size given
  means "pad to that cap" (the cap is appended).
- ``CUDAGraphRunner._maybe_get_cuda_graph`` / ``_round_up_batch_size`` (cuda_graph_runner.py, index id
  5661567389): a graph runs only for generation-only batches whose size was captured; with padding a batch is
  rounded up to the next captured size; anything larger decodes eagerly.

kvsim's assumptions (NOT measured, NOT calibrated; stated so they can be replaced by a measurement):

- ``EAGER_LAUNCH_S_PER_LAYER``: an eager decode step pays this much more per decoder layer than a replayed
  graph (kernel launches and Python overhead a graph removes), added to the step, not overlapped. The
  calibrated profile is taken as the graphed speed. Iterations that carry context run eagerly in TensorRT-LLM
  too, but kvsim charges them nothing extra: the calibration's prefill figures already include them.
- ``GRAPH_POOL`` memory: the graphs share one memory pool, which holds the largest captured batch's decode
  activations (the live activation bytes per token of ``memory.activation_bytes`` plus FP32 logits over the
  vocabulary, per sequence); each graph adds ``GRAPH_OVERHEAD_BYTES``.
- ``GRAPH_CAPTURE_S`` seconds of start-up per captured size (warm-up runs and capture).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .profiles import Profile

DEFAULT_MAX_BATCH_SIZE = 128  # CudaGraphConfig: "If neither is provided, a default max_batch_size of 128 is used."
EAGER_LAUNCH_S_PER_LAYER = 40e-6  # assumption, see the module docstring
GRAPH_OVERHEAD_BYTES = 2 << 20  # assumption: 2 MiB per captured graph
GRAPH_CAPTURE_S = 0.1  # assumption: start-up seconds per captured size
KEYS = {"batch_sizes", "max_batch_size", "enable_padding"}


class CudaGraphConfigError(ValueError):
    """The LLM-API YAML's cuda_graph_config is refused (TorchLlmArgs would raise); names the field."""


def generated_batch_sizes(max_batch_size: int, enable_padding: bool) -> tuple[int, ...]:
    """CudaGraphConfig._generate_cuda_graph_batch_sizes (1.2-era llm_args.py)."""
    sizes = [1, 2, 4] + [i * 8 for i in range(1, 17)] if enable_padding else list(range(1, 32)) + [32, 64, 128]
    if max_batch_size > 1:
        sizes += [2**i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]
    sizes = sorted(s for s in sizes if s <= max_batch_size)
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


@dataclass(frozen=True, slots=True)
class CudaGraphs:
    """The sizes a PyTorch engine is asked to capture (before the engine's own filter) and padding."""

    batch_sizes: tuple[int, ...] = generated_batch_sizes(DEFAULT_MAX_BATCH_SIZE, False)
    enable_padding: bool = False

    @classmethod
    def from_llm_api(cls, section: Any, where: str = "cuda_graph_config") -> CudaGraphs:
        """The validated section of the LLM-API YAML (a mapping; None is handled by the caller: graphs off)."""
        if not isinstance(section, Mapping):
            raise CudaGraphConfigError(f"{where} must be a mapping (batch_sizes, max_batch_size, enable_padding)")
        unknown = sorted(set(section) - KEYS)
        if unknown:
            raise CudaGraphConfigError(f"{where}.{unknown[0]}: Extra inputs are not permitted")
        padding = section.get("enable_padding", False)
        if not isinstance(padding, bool):
            raise CudaGraphConfigError(f"{where}.enable_padding: Input should be a valid boolean")
        max_bs = section.get("max_batch_size", 0)
        if isinstance(max_bs, bool) or not isinstance(max_bs, int):
            raise CudaGraphConfigError(f"{where}.max_batch_size: Input should be a valid integer")
        if max_bs < 0:
            raise CudaGraphConfigError("cuda_graph_config.max_batch_size must be non-negative")
        sizes = section.get("batch_sizes")
        if sizes:
            if not isinstance(sizes, list) or len(sizes) > 4096 or any(
                    isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
                raise CudaGraphConfigError(f"{where}.batch_sizes must be a list of positive integers")
            ordered = tuple(sorted(sizes))
            if max_bs and ordered != generated_batch_sizes(max_bs, padding):
                raise CudaGraphConfigError("Please don't set both cuda_graph_config.batch_sizes and "
                                           "cuda_graph_config.max_batch_size.")
            return cls(ordered, padding)
        if max_bs > 1 << 20:
            raise CudaGraphConfigError(f"{where}.max_batch_size must be at most {1 << 20}")
        return cls(generated_batch_sizes(max_bs or DEFAULT_MAX_BATCH_SIZE, padding), padding)

    def captured(self, max_batch_size: int, max_num_tokens: int) -> tuple[int, ...]:
        """_filter_cuda_graph_batch_sizes: what the engine really captures for its runtime limits."""
        cap = min(max_batch_size, max_num_tokens)
        kept = [s for s in self.batch_sizes if s <= cap]
        if self.enable_padding and len(kept) < len(self.batch_sizes) and (not kept or kept[-1] != cap):
            kept.append(cap)
        return tuple(kept)


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """The captured sizes of one engine and what a decode step costs without a graph (seconds)."""

    sizes: tuple[int, ...]
    enable_padding: bool
    eager_step_s: float
    size_set: frozenset[int]

    @property
    def max_size(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def graph_size(self, n_gen: int) -> int | None:
        """The captured size a generation-only batch of ``n_gen`` replays (padded up), None when eager."""
        if n_gen in self.size_set:
            return n_gen
        if self.enable_padding and 0 < n_gen <= self.max_size:
            return self.sizes[bisect.bisect_left(self.sizes, n_gen)]
        return None

    def memory_bytes(self, profile: Profile) -> float:
        """The shared graph pool (the largest captured batch's decode activations and logits) plus per-graph
        overhead; an assumption (module docstring)."""
        if not self.sizes:
            return 0.0
        m = profile.model
        per_seq = (3 * m.intermediate_size / profile.tp + 2 * m.hidden_size) * 2.0 + m.vocab_size * 4.0
        return self.max_size * per_seq + len(self.sizes) * GRAPH_OVERHEAD_BYTES

    @property
    def capture_s(self) -> float:
        return len(self.sizes) * GRAPH_CAPTURE_S


def plan_graphs(graphs: CudaGraphs | None, profile: Profile, max_batch_size: int, max_num_tokens: int) -> GraphPlan:
    """The engine's graphs: None (``cuda_graph_config: null``) captures nothing, every decode step is eager."""
    sizes = graphs.captured(max_batch_size, max_num_tokens) if graphs is not None else ()
    padding = graphs.enable_padding if graphs is not None else False
    return GraphPlan(sizes, padding, EAGER_LAUNCH_S_PER_LAYER * profile.model.num_layers, frozenset(sizes))
