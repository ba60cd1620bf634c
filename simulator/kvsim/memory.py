"""Where one GPU's memory goes, and so how many KV blocks the pool gets.

TensorRT-LLM sizes the KV pool last: weights are loaded, the engine's activation/runtime buffers are
allocated (their size is fixed at BUILD time by max_batch_size and max_num_tokens), and then
``free_gpu_memory_fraction`` of what is left becomes KV blocks (docs/source/reference/memory.md). That order is
why a higher build ceiling costs blocks: this module reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import ACTIVATION_FIXED_BYTES, Profile


def activation_bytes(profile: Profile, build_max_batch_size: int, build_max_num_tokens: int) -> float:
    """Activation + runtime buffers of one GPU for an engine built with these ceilings.

    Live tensors per batched token: the fused gate/up output, the activation output and two hidden-size
    buffers (BF16), sharded by TP. Per sequence: FP32 logits over the vocabulary (sampling/decoder buffers).
    Plus a fixed workspace (CUDA context, cuBLAS/NCCL workspaces). With the defaults (2048, 8192) this is
    ~2.8 GiB for Llama-3.1-8B, in line with the ~3 GiB used in NVIDIA-style sizing.
    """
    m = profile.model
    per_token = (3 * m.intermediate_size / profile.tp + 2 * m.hidden_size) * 2.0
    per_sequence = m.vocab_size * 4.0
    return ACTIVATION_FIXED_BYTES + build_max_num_tokens * per_token + build_max_batch_size * per_sequence


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
) -> MemoryPlan:
    """KV pool = fraction x (GPU memory - weights - activations), in whole blocks, capped by ``max_tokens``."""
    if not 0.0 < free_gpu_memory_fraction <= 1.0:
        raise ValueError(
            f"kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {free_gpu_memory_fraction}"
        )
    weights = profile.weights_resident_bytes
    activations = activation_bytes(profile, build_max_batch_size, build_max_num_tokens)
    free = profile.gpu.memory_bytes - weights - activations
    if free <= 0:
        raise ValueError(
            f"profile {profile.name}: weights ({weights / 1e9:.1f} GB) and activations "
            f"({activations / 1e9:.1f} GB) do not fit in {profile.gpu.memory_bytes / 1e9:.1f} GB; "
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
