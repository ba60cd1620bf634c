"""The suite where the engine is not the model (issue 18): the SERVED engine is a perturbed kvsim profile, while
the tuner's what-if keeps the nominal profile the engine names.

kvsim's own held-out error against NVIDIA's published tables is 6.6% in median and 28% at worst (70B TP2
decode-heavy rows, all over-predicted), so each perturbation stays within +/-30% of a calibrated parameter:

* ``decode`` multiplies ``Calibration.hbm_efficiency`` (above 1: faster memory-bound decode);
* ``prefill`` multiplies ``Calibration.prefill_mfu`` (above 1: faster prefill);
* ``overhead`` multiplies ``Calibration.step_overhead_s`` (above 1: slower, each iteration's fixed cost);
* ``per_seq`` multiplies ``Calibration.per_sequence_s`` (above 1: slower, the cost per scheduled sequence);
* ``memory`` multiplies ``GpuSpec.memory_bytes`` (above 1: more memory; the KV pool, what is left after weights,
  activations and runtime buffers, moves by more than the factor in proportion, so memory stays within +/-20%).

The factors are kvsim's own (``kvsim.perturb.Perturbation``; ``KVSIM_PERTURB`` serves the same engine from a
pod, e.g. in the closed-loop e2e).
"""

from __future__ import annotations

from kvsim.perturb import Perturbation
from kvsim.profiles import Profile, get_profile

NOMINAL = Perturbation()

# Each calibrated parameter and the GPU memory alone, in both directions, then combinations. The names are part of
# the suite's row names (an SVG file per row), so letters, digits, '.' and '-' only.
PERTURBATIONS: dict[str, Perturbation] = {
    "decode0.7": Perturbation(decode=0.7),
    "decode1.3": Perturbation(decode=1.3),
    "prefill0.7": Perturbation(prefill=0.7),
    "prefill1.3": Perturbation(prefill=1.3),
    "overhead0.7": Perturbation(overhead=0.7),
    "overhead1.3": Perturbation(overhead=1.3),
    "perseq0.7": Perturbation(per_seq=0.7),
    "perseq1.3": Perturbation(per_seq=1.3),
    "memory0.8": Perturbation(memory=0.8),
    "memory1.2": Perturbation(memory=1.2),
    # Issue 18's own example: an engine that decodes about 20% slower than its profile.
    "decode0.8-perseq1.5": Perturbation(decode=0.8, per_seq=1.5),
    "all-slow": Perturbation(decode=0.8, prefill=0.8, overhead=1.25, per_seq=1.25, memory=0.9),
    "all-fast": Perturbation(decode=1.2, prefill=1.2, overhead=0.8, per_seq=0.8, memory=1.1),
}


def served_profile(profile: str, perturbation: Perturbation | None) -> Profile | str:
    """The profile the served pods run: the name itself when nominal (so a nominal run's configuration is exactly
    what it was before perturbations existed), else the perturbed profile."""
    if perturbation is None or perturbation.is_identity:
        return profile
    return perturbation.apply(get_profile(profile))


def perturbation_named(name: str) -> Perturbation:
    """The perturbation called ``name`` ("nominal" is the identity); KeyError naming the known ones."""
    if name == "nominal":
        return NOMINAL
    if name not in PERTURBATIONS:
        raise KeyError(f"unknown perturbation {name!r}; perturbations: nominal, {', '.join(PERTURBATIONS)}")
    return PERTURBATIONS[name]
