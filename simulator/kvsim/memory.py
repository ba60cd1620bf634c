"""Where one GPU's memory goes, and so how many KV blocks the pool gets.

TensorRT-LLM sizes the KV pool last: weights are loaded, the engine's activation buffers are allocated (their
size is fixed at BUILD time by max_num_tokens: "Once the TensorRT engine is built, the activation memory size of
that engine cannot be changed"), then the runtime and decoder buffers, which "are allocated based on the runtime
max_batch_size and max_seq_len" (docs/source/reference/memory.md @ 7ff53023, quoted in
shared/reference/trtllm.md section 9), and then ``free_gpu_memory_fraction`` of what is left becomes KV blocks.

That order is why a higher RUNTIME max_batch_size costs KV blocks, not only a higher build ceiling: the
per-slot buffers of the executor are allocated for every batch slot whether it is used or not. In the 1.2 C++
runtime these are the decoder state and sampling buffers (cpp/tensorrt_llm/runtime/decoderState.cpp,
gptDecoderBatched.cpp: ``DecoderDomain(maxBatchSize, maxBeamWidth, vocabSize...)``; the decoding layers
"reserve resources" for ``maxBatchSize`` slots, cpp/tensorrt_llm/layers/decodingParams.h) and the per-slot
logits and output-id buffers (cpp/tensorrt_llm/runtime/runtimeBuffers.cpp). kvsim models them as
``runtime_buffer_bytes``: per slot, FP32 logits plus an FP32 sampling workspace over the vocabulary, and INT32
output ids over max_seq_len. This module reproduces the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import ACTIVATION_FIXED_BYTES, Profile


def activation_bytes(profile: Profile, build_max_batch_size: int, build_max_num_tokens: int) -> float:
    """Activation buffers of one GPU for an engine built with these ceilings (fixed at build time).

    Live tensors per batched token: the fused gate/up output, the activation output and two hidden-size
    buffers (BF16), sharded by TP. Plus a fixed workspace (CUDA context, cuBLAS/NCCL workspaces).
    ``build_max_batch_size`` no longer appears: the per-sequence buffers follow the RUNTIME limit
    (``runtime_buffer_bytes``). With the defaults (2048, 8192, max_seq_len 131072) activations plus runtime
    buffers are ~4.5 GiB for Llama-3.1-8B.
    """
    del build_max_batch_size  # kept in the signature: callers pass the build ceiling
    m = profile.model
    per_token = (3 * m.intermediate_size / profile.tp + 2 * m.hidden_size) * 2.0
    return ACTIVATION_FIXED_BYTES + build_max_num_tokens * per_token


def runtime_buffer_bytes(profile: Profile, max_batch_size: int, max_seq_len: int) -> float:
    """Per-slot runtime/decoder buffers of one GPU, sized by the RUNTIME max_batch_size before the KV pool.

    Per slot: FP32 logits and an FP32 sampling workspace (probabilities for top-k/top-p) over the vocabulary
    (replicated on every TP rank: the decoder runs on each), and INT32 output ids over max_seq_len. For
    Llama-3.1 (vocab 128256, max_seq_len 131072) that is ~1.5 MiB per slot: 64 slots cost ~0.1 GB, 2048
    slots ~3.2 GB, which is a large share of the pool on a 24 or 48 GB GPU.
    """
    per_slot = profile.model.vocab_size * (4.0 + 4.0) + max_seq_len * 4.0
    return max_batch_size * per_slot


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory budget and the resulting KV pool."""

    gpu_memory_bytes: float
    weights_bytes: float
    activation_bytes: float
    kv_pool_bytes: float
    bytes_per_block: float
    num_blocks: int
    tokens_per_block: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.tokens_per_block

    @property
    def used_bytes(self) -> float:
        """What the engine holds on the GPU once loaded (what gpuMemUsage reports)."""
        return self.weights_bytes + self.activation_bytes + self.num_blocks * self.bytes_per_block


def plan_memory(
    profile: Profile,
    build_max_batch_size: int,
    build_max_num_tokens: int,
    tokens_per_block: int,
    free_gpu_memory_fraction: float,
    max_tokens: int | None = None,
    runtime_max_batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> MemoryPlan:
    """KV pool = fraction x (GPU memory - weights - activations - runtime buffers), in whole blocks, capped by
    ``max_tokens``. ``runtime_max_batch_size`` defaults to the build ceiling (what trtllm-serve runs with
    unless told otherwise); ``max_seq_len`` to the model's context length."""
    if not 0.0 < free_gpu_memory_fraction <= 1.0:
        raise ValueError(
            f"kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {free_gpu_memory_fraction}"
        )
    weights = profile.weights_resident_bytes
    runtime_bs = build_max_batch_size if runtime_max_batch_size is None else runtime_max_batch_size
    seq_len = max_seq_len or profile.model.max_position_embeddings
    activations = activation_bytes(profile, build_max_batch_size, build_max_num_tokens) + runtime_buffer_bytes(
        profile, runtime_bs * profile.pp, seq_len)
    free = profile.gpu.memory_bytes - weights - activations
    if free <= 0:
        raise ValueError(
            f"profile {profile.name}: weights ({weights / 1e9:.1f} GB) and activations "
            f"({activations / 1e9:.1f} GB with the runtime buffers) do not fit in {profile.gpu.memory_bytes / 1e9:.1f} GB; "
            "lower max_batch_size/max_num_tokens or use more GPUs"
        )
    pool = free * free_gpu_memory_fraction
    bytes_per_block = profile.kv_bytes_per_token * tokens_per_block
    blocks = int(pool // bytes_per_block)
    if max_tokens is not None:
        blocks = min(blocks, max_tokens // tokens_per_block)
    if blocks < 1:
        raise ValueError(f"profile {profile.name}: the KV pool holds no block of {tokens_per_block} tokens")
    return MemoryPlan(
        gpu_memory_bytes=profile.gpu.memory_bytes,
        weights_bytes=weights,
        activation_bytes=activations,
        kv_pool_bytes=blocks * bytes_per_block,
        bytes_per_block=bytes_per_block,
        num_blocks=blocks,
        tokens_per_block=tokens_per_block,
    )
