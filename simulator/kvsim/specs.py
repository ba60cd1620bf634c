"""Hardware and model facts, taken from vendor and model specifications (never fitted).

Why a separate module: the calibration fits four numbers that describe how well the software uses the
hardware (see ``profiles.Calibration``); everything here is a property of the silicon or the checkpoint and
must stay identical across profiles, so that a profile for a new GPU or model needs no new fitting.

Sources (see docs/kvsim/README.md):
- HBM bandwidth and dense peaks: BLIS ``hardware_config.json`` (A100, H100), NVIDIA H200 spec (4.8 TB/s, 141 GB).
- Usable memory: the ``nvidia-smi`` totals of the 80 GB / 141 GB SXM parts (81559 MiB H100, 81920 MiB A100,
  143771 MiB H200).
- NVLink: 900 GB/s (H100/H200 SXM, both directions together), 600 GB/s (A100 SXM).
- Llama-3.1 shapes: the models' ``config.json`` (layers, hidden, heads, KV heads, FFN, vocab, 131072 positions).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet numbers, per device."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None  # None: no FP8 tensor cores (A100)
    nvlink_bytes_per_s: float  # both directions together, as NVIDIA quotes it
    product_label: str  # the node label nvidia.com/gpu.product of such a GPU


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape, as its checkpoint config.json states it."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of the stacked decoder layers (attention, gated MLP, two RMS norms)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * (self.num_heads * self.head_dim) * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attention + mlp + 2 * h)

    @property
    def total_params(self) -> int:
        """Layers + input embedding + untied LM head + final norm."""
        return self.layer_params + 2 * self.embedding_params + self.hidden_size


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 81559 * MIB, 3.35e12, 989.5e12, 1979e12, 900e9, "NVIDIA-H100-80GB-HBM3"),
    "h200": GpuSpec("h200", 143771 * MIB, 4.8e12, 989.5e12, 1979e12, 900e9, "NVIDIA-H200"),
    "a100": GpuSpec("a100", 81920 * MIB, 2.039e12, 312e12, None, 600e9, "NVIDIA-A100-SXM4-80GB"),
    # KV-scarce PCIe GPUs (datasheets: L40S 48 GB GDDR6 864 GB/s, 362 / 733 dense BF16 / FP8 TFLOPS; L4 24 GB
    # 300 GB/s, 121 / 242.5 dense TFLOPS; no NVLink, so the "link" is PCIe Gen4 x16, 64 GB/s both ways).
    "l40s": GpuSpec("l40s", 46068 * MIB, 864e9, 362e12, 733e12, 64e9, "NVIDIA-L40S"),
    "l4": GpuSpec("l4", 23034 * MIB, 300e9, 121e12, 242.5e12, 64e9, "NVIDIA-L4"),
}

MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", "LlamaForCausalLM", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
    "llama-3.1-70b": ModelSpec("llama-3.1-70b", "LlamaForCausalLM", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
    # meta-llama/Llama-3.1-405B config.json (the gated file itself was not read; these values agree across the
    # public copies found): 126 layers, hidden 16384, 128 heads, 8 KV heads, MLP 53248. Served multi-node.
    "llama-3.1-405b": ModelSpec("llama-3.1-405b", "LlamaForCausalLM", 126, 16384, 128, 8, 128, 53248, 128256, 131072),
}

# dtype name -> (bytes per linear-layer weight, bytes per KV element, TRT-LLM quant_algo, kv_cache_quant_algo)
DTYPES: dict[str, tuple[float, float, str | None, str | None]] = {
    "fp8": (1.0, 1.0, "FP8", "FP8"),
    "bf16": (2.0, 2.0, None, None),
    "fp16": (2.0, 2.0, None, None),
    "fp8w": (1.0, 2.0, "FP8", None),  # FP8 weights, 16-bit KV cache
    "bf16-kvfp8": (2.0, 1.0, None, "FP8"),  # 16-bit weights, FP8 KV cache
}


def dtype_key(quant_algo: str | None, kv_cache_quant_algo: str | None, dtype: str = "bfloat16") -> str:
    """The DTYPES key for a checkpoint's quantization (anything not FP8 is treated as 16-bit)."""
    weights_fp8 = (quant_algo or "").upper().startswith("FP8")
    kv_fp8 = (kv_cache_quant_algo or "").upper().startswith("FP8")
    base = "fp16" if dtype == "float16" else "bf16"
    return {(True, True): "fp8", (True, False): "fp8w", (False, True): "bf16-kvfp8", (False, False): base}[
        (weights_fp8, kv_fp8)]
