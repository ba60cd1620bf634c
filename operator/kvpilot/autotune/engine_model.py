"""The engine the what-if simulates: a kvsim profile for the pods, calibrated to what they report (issue 18).

Where "no profile" was decided: ``desired/plan._what_if`` and ``planning.may_simulate`` gave the what-if a model
only for the simulated backend naming a kvsim profile; every real engine (tensorrt, pytorch) got none, and the
rules alone decided. ``base_model`` replaces that test:

1. the simulated backend: the profile it names;
2. otherwise the kvsim profile of the spec's model, precision and GPU, where kvsim knows all three (the model
   from ``model.source``, matched against kvsim's model names by family and size; the GPU from
   ``serving.gpuProduct`` against the GPUs' node labels; the precision from ``build.quantization`` and
   ``build.kvCacheDtype``; TP and PP from the build);
3. otherwise a template: kvsim's model of the nearest size on the GPU if kvsim knows it, else on the template
   GPU, with ``known=False``. The fit (``calibrate.EngineFit``) then frees the template's weight stream from
   its KV reads (their ratio is the model's, which kvsim does not know), ``calibrated_profile`` turns the fit
   into a profile, and the model's measured error (``trust.py``) says whether the what-if may use it.

``calibrated_profile`` puts the fitted calibration into the profile and sizes its GPU memory so that kvsim's
memory plan, for the configuration the what-if simulates, carves the KV pool the pods report at the limit in
force (``maxNumBlocks`` x ``tokensPerBlock``): other limits then get that pool minus or plus their per-slot
runtime buffers, as kvsim models them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from kvsim import Calibration, Profile, get_profile
from kvsim.memory import plan_for
from kvsim.specs import DTYPES, GPUS, MODELS, GpuSpec, ModelSpec, dtype_key

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.autotune.calibrate import FitResult
from kvpilot.autotune.whatif import sim_config

TEMPLATE_MODEL = "llama-3.1-8b"
TEMPLATE_GPU = "h100"
# Families whose shapes kvsim's Llama-3.1 models share closely enough to be "known" (llama-3.3-70b has the
# shapes of llama-3.1-70b: kvsim.calibration's held-out rows).
KNOWN_FAMILIES = ("llama-3.1", "llama-3.3", "meta-llama-3.1", "meta-llama-3.3")
AMPLE_MEMORY_BYTES = 1 << 50  # more than any GPU: the plan then always fits, and says what is held besides the pool
GRID = 0.002  # fitted values rounded to a 0.2% log grid: a fit that barely moved replays the memoized simulation


@dataclass(frozen=True)
class BaseModel:
    """The profile a fit starts from, and whether kvsim knows the engine (``known``) or it is a template."""

    profile: Profile
    known: bool
    source: str  # how it was chosen, for status and logs


def base_model(spec: InferenceEngineSpec) -> BaseModel:
    """The kvsim profile for this engine's pods (see the module docstring); never None."""
    sim = spec.runtime.simulation
    if spec.runtime.backend == "simulated" and sim is not None and sim.profile:
        try:
            return BaseModel(get_profile(sim.profile), True, f"kvsim profile {sim.profile}")
        except KeyError:
            pass  # validation refuses unknown profiles; a template serves anyway
    build = spec.build
    model, model_known = _model(spec.model.source)
    gpu, gpu_known = _gpu(spec.serving.gpu_product)
    quantization = "FP8" if build.quantization == "fp8" else None
    kv_quant = "FP8" if build.kv_cache_dtype == "fp8" else None
    dtype = dtype_key(quantization, kv_quant, build.dtype)
    precision_known = build.quantization in ("none", "fp8") and build.kv_cache_dtype in ("auto", "fp8")
    if dtype not in DTYPES:
        dtype, precision_known = "bf16", False
    tp, pp = max(1, build.tensor_parallel_size), max(1, build.pipeline_parallel_size)
    name = f"{model.name}-{dtype}-{gpu.name}" + (f"-tp{tp}" if tp > 1 else "") + (f"-pp{pp}" if pp > 1 else "")
    profile = Profile(name=name, model=model, gpu=gpu, dtype=dtype, tp=tp, pp=pp)
    known = model_known and gpu_known and precision_known
    what = "kvsim's model of" if known else "a template for"
    return BaseModel(profile, known, f"{what} {spec.model.source} on {spec.serving.gpu_product or 'an unnamed GPU'}: {name}")


def _model(source: str) -> tuple[ModelSpec, bool]:
    """kvsim's model named by the source (family and size), or the one of the nearest size as a template."""
    name = source.rsplit("/", 1)[-1].lower()
    size = re.search(r"(\d+(?:\.\d+)?)b\b", name)
    billions = float(size.group(1)) if size else 8.0
    nearest = min(MODELS.values(), key=lambda m: abs(math.log(m.total_params / 1e9 / max(billions, 0.1))))
    family = any(name.startswith(f) for f in KNOWN_FAMILIES)
    exact = family and size is not None and nearest.name.endswith(f"-{size.group(1)}b")
    return nearest, exact


def _gpu(product: str | None) -> tuple[GpuSpec, bool]:
    """kvsim's GPU for a node label (exact label first, then the GPU's name inside it), else the template."""
    if product:
        for gpu in GPUS.values():
            if gpu.product_label == product:
                return gpu, True
        lowered = product.lower()
        for key, gpu in GPUS.items():
            if re.search(rf"(^|[^a-z0-9]){re.escape(key)}([^a-z0-9]|$)", lowered):
                return gpu, True
    return GPUS[TEMPLATE_GPU], False


def calibrated_profile(base: BaseModel, fit: FitResult, ceiling: int, scheduler_policy: str,
                       backend: str = "tensorrt") -> Profile:
    """The base profile with the fitted calibration (and, for a template, the fitted weight stream), its GPU
    memory sized to the pool the pods report at the limit in force. Values on a 1% grid (see GRID)."""
    cal = fit.calibration
    profile = replace(base.profile, name=f"{base.profile.name}-calibrated",
                      calibration=Calibration(_q(cal.hbm_efficiency), _q(cal.prefill_mfu),
                                              _q(cal.step_overhead_s), _q(cal.per_sequence_s)))
    if not base.known and abs(fit.weights_scale - 1.0) > GRID:
        profile = _with_weight_stream(profile, _q(fit.weights_scale))
    if fit.pool_tokens:
        limit, tokens = fit.pool_tokens[-1]
        memory = memory_for_pool(profile, ceiling, min(limit, ceiling), tokens, scheduler_policy, backend)
        if memory is not None:
            profile = replace(profile, gpu=replace(profile.gpu, memory_bytes=memory))
    return profile


def _with_weight_stream(profile: Profile, scale: float) -> Profile:
    """A template whose decode step streams ``scale`` times its weight bytes at the same HBM efficiency, by its
    FFN width; the prefill efficiency is scaled back so a token's GEMM costs what the fit says."""
    m = profile.model
    wb = profile.weight_bytes_per_elem
    weights = m.layer_params * wb + m.embedding_params * 2.0
    layer_params = (scale * weights - m.embedding_params * 2.0) / wb
    h, kv = m.hidden_size, m.num_kv_heads * m.head_dim
    per_layer_rest = h * (m.num_heads * m.head_dim) * 2 + h * kv * 2 + 2 * h
    intermediate = max(1, round((layer_params / m.num_layers - per_layer_rest) / (3 * h)))
    model = replace(m, name=f"{m.name}-fitted", intermediate_size=intermediate)
    mfu = profile.calibration.prefill_mfu * model.layer_params / m.layer_params
    return replace(profile, model=model, calibration=replace(profile.calibration, prefill_mfu=mfu))


def memory_for_pool(profile: Profile, ceiling: int, limit: int, pool_tokens: int, scheduler_policy: str,
                    backend: str = "tensorrt") -> int | None:
    """GPU memory (bytes) for which kvsim's memory plan of the what-if's configuration at ``limit`` carves a pool
    of ``pool_tokens`` KV tokens; None when that is not possible. kvsim's own plan (``plan_for``, numbers
    only) on ample memory gives what is held besides the pool (weights, activations, runtime buffers), whatever
    formula kvsim uses for them; the pool fraction applies to what is left."""
    if pool_tokens <= 0 or limit <= 0 or ceiling <= 0:
        return None
    ample = replace(profile, gpu=replace(profile.gpu, memory_bytes=AMPLE_MEMORY_BYTES))
    try:
        cfg = sim_config(ample, ceiling, limit, scheduler_policy, backend).resolved()
        plan = plan_for(cfg)
    except ValueError:
        return None
    fraction = cfg.free_gpu_memory_fraction
    blocks = max(1, round(pool_tokens / plan.tokens_per_block))
    memory = plan.weights_bytes + plan.activation_bytes + (blocks + 0.5) * plan.bytes_per_block / fraction
    return int(memory) if math.isfinite(memory) and memory > plan.weights_bytes + plan.activation_bytes else None


def _q(x: float) -> float:
    if not (x > 0 and math.isfinite(x)):
        return x
    return float(f"{math.exp(round(math.log(x) / GRID) * GRID):.4g}")
