"""Simulation profiles: a model, a dtype, a GPU and a tensor-parallel degree, plus ONE calibrated parameter set.

A profile is named ``<model>-<dtype>-<gpu>[-tpN]`` (for example ``llama-3.1-70b-fp8-h100-tp4``). Everything that
differs between profiles comes from ``specs`` (datasheets and model shapes); the four numbers of ``Calibration``
are shared by all profiles. They were fitted once, to NVIDIA's published H100 throughput table for
Llama-3.1-8B FP8 (``kvsim.calibration``), which is why the other profiles are predictions, not fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .specs import DTYPES, GPUS, MODELS, GpuSpec, ModelSpec


@dataclass(frozen=True)
class Calibration:
    """How well the software uses the hardware; fitted to NVIDIA's H100 table (see kvsim.calibration).

    hbm_efficiency: fraction of HBM bandwidth a decode step reaches (weights + KV reads).
    prefill_mfu: fraction of the dense tensor peak a context (prefill) chunk reaches.
    step_overhead_s: fixed cost of one iteration (launches, scheduler, sampling setup).
    per_sequence_s: cost per scheduled sequence (sampling, attention-kernel inefficiency per sequence).
    """

    hbm_efficiency: float = 0.90
    prefill_mfu: float = 0.525
    step_overhead_s: float = 0.25e-3
    per_sequence_s: float = 1.25e-6


# Modelling assumptions that are NOT fitted (documented in docs/kvsim/README.md):
# - a KV block's (layer, head, K|V) chunk costs this many extra "equivalent bytes" to fetch (page-table lookup,
#   partial DRAM bursts): this is what makes very small blocks slower;
KV_BLOCK_OVERHEAD_BYTES = 512
# - one all-reduce per attention and one per MLP, each with this latency plus bytes over NVLink;
ALLREDUCE_LATENCY_S = 6e-6
# - activation memory: fixed workspace + live tensors per batched token + FP32 logits per sequence.
ACTIVATION_FIXED_BYTES = 1 << 30

# Fitted by ``kvsim calibrate`` (kvsim.calibration.fit) to the ten H100 rows; see docs/kvsim/README.md.
CALIBRATION = Calibration(hbm_efficiency=0.90, prefill_mfu=0.525, step_overhead_s=0.25e-3, per_sequence_s=1.25e-6)

_NAME = re.compile(r"^(?P<model>.+?)-(?P<dtype>fp8|bf16|fp16)-(?P<gpu>[a-z0-9]+?)(?:-tp(?P<tp>\d+))?(?:-pp(?P<pp>\d+))?$")


@dataclass(frozen=True)
class Profile:
    """What kvsim simulates: ``model`` in ``dtype`` on ``tp`` x ``pp`` GPUs of kind ``gpu``."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    dtype: str
    tp: int = 1
    pp: int = 1
    calibration: Calibration = field(default=CALIBRATION)

    @property
    def weight_bytes_per_elem(self) -> float:
        return DTYPES[self.dtype][0]

    @property
    def kv_bytes_per_elem(self) -> float:
        return DTYPES[self.dtype][1]

    @property
    def quant_algo(self) -> str | None:
        return DTYPES[self.dtype][2]

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return DTYPES[self.dtype][3]

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def kv_heads_per_gpu(self) -> float:
        """KV heads held by one TP rank (heads are replicated when TP exceeds their number)."""
        return max(self.tp, self.model.num_kv_heads) / self.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token occupies on one GPU: 2 (K,V) x layers/PP x KV heads/TP x head_dim x bytes."""
        m = self.model
        return 2 * (m.num_layers / self.pp) * self.kv_heads_per_gpu * m.head_dim * self.kv_bytes_per_elem

    @property
    def weights_resident_bytes(self) -> float:
        """Weights held by one GPU: FP8 (or BF16) linear layers, BF16 embedding and LM head."""
        m = self.model
        linear = m.layer_params * self.weight_bytes_per_elem
        embeddings = 2 * m.embedding_params * 2.0
        return (linear + embeddings) / self.num_gpus

    @property
    def tensor_flops(self) -> float:
        """Dense peak one GPU offers for this dtype's GEMMs."""
        if self.weight_bytes_per_elem <= 1.0 and self.gpu.fp8_flops:
            return self.gpu.fp8_flops
        return self.gpu.bf16_flops

    def with_parallelism(self, tp: int, pp: int = 1) -> Profile:
        """The same model/dtype/GPU on another mapping (a checkpoint's tp_size/pp_size decide it)."""
        if tp < 1 or pp < 1:
            raise ValueError(f"profile {self.name}: tp and pp must be >= 1, got tp={tp} pp={pp}")
        base = self.name.split("-tp")[0]
        name = base if tp == 1 else f"{base}-tp{tp}"
        if pp > 1:
            name += f"-pp{pp}"
        return replace(self, name=name, tp=tp, pp=pp)


def _make(name: str) -> Profile:
    match = _NAME.match(name)
    if not match:
        raise KeyError(f"profile name {name!r} must look like <model>-<dtype>-<gpu>[-tpN][-ppN]")
    model, dtype, gpu = match["model"], match["dtype"], match["gpu"]
    if model not in MODELS:
        raise KeyError(f"profile {name!r}: unknown model {model!r}; known: {sorted(MODELS)}")
    if gpu not in GPUS:
        raise KeyError(f"profile {name!r}: unknown GPU {gpu!r}; known: {sorted(GPUS)}")
    if dtype == "fp8" and GPUS[gpu].fp8_flops is None:
        raise KeyError(f"profile {name!r}: GPU {gpu} has no FP8 support")
    return Profile(name=name, model=MODELS[model], gpu=GPUS[gpu], dtype=dtype, tp=int(match["tp"] or 1),
                   pp=int(match["pp"] or 1))


PROFILE_NAMES = (
    "llama-3.1-8b-fp8-h100",
    "llama-3.1-8b-bf16-h100",
    "llama-3.1-8b-bf16-a100",
    "llama-3.1-8b-fp8-h200",
    "llama-3.1-8b-fp8-l40s",
    "llama-3.1-8b-fp8-l4",
    "llama-3.1-70b-fp8-h100-tp2",
    "llama-3.1-70b-fp8-h100-tp4",
    "llama-3.1-70b-fp8-h200",
    "llama-3.1-70b-bf16-h100-tp4",
    # Two 8-GPU nodes (a LeaderWorkerSet group of 2): 810 GB of BF16 weights need 16 H100s (docs/multinode.md).
    "llama-3.1-405b-bf16-h100-tp8-pp2",
)
PROFILES: dict[str, Profile] = {n: _make(n) for n in PROFILE_NAMES}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; any well-formed ``<model>-<dtype>-<gpu>[-tpN]`` of known parts works."""
    if name in PROFILES:
        return PROFILES[name]
    return _make(name)
