"""A perturbed engine: the same profile with its calibration and its GPU memory multiplied by stated factors.

Why: a real engine is not its profile (kvsim's own held-out error is 6.6% median, 28% worst). The tuner's tests
need an engine that differs from the model the tuner starts from, in a known direction and by a known amount,
both offline (``Perturbation.apply``) and in a served pod (the ``KVSIM_PERTURB`` environment variable, read by
``kvsim trtllm-serve`` and ``kvsim trtllm-build``).

Text form (``KVSIM_PERTURB``): comma-separated ``key=factor`` pairs, each key at most once, for example
``decode=0.8,prefill=1.1,overhead=1.5,per_seq=1.5,memory=0.9``. An empty text is the identity. Every factor
is a finite number in [0.25, 4]. The keys, what each multiplies, and the direction:

=========  ==================================  ===============================================================
key        multiplies                          effect of a factor above 1
=========  ==================================  ===============================================================
decode     ``Calibration.hbm_efficiency``      FASTER: weight streaming and KV reads (the memory-bound part
                                               of every iteration) take 1/factor as long
prefill    ``Calibration.prefill_mfu``         FASTER: compute-bound GEMMs and context attention take
                                               1/factor as long
overhead   ``Calibration.step_overhead_s``     SLOWER: the fixed cost of each iteration is factor times longer
per_seq    ``Calibration.per_sequence_s``      SLOWER: the cost per scheduled sequence is factor times longer
memory     ``GpuSpec.memory_bytes``            MORE memory: the engine sees factor times the GPU's memory, so
                                               the KV pool (what is left after weights, activations and
                                               runtime buffers) grows by more than the factor in proportion
=========  ==================================  ===============================================================

So ``decode=0.8`` is an engine whose memory-bound work is 25% slower (1/0.8), ``memory=0.9`` one with 10% less
GPU memory. The factors are model knobs, not physics: ``decode=1.2`` gives an HBM efficiency of 1.08, above the
datasheet bandwidth, which kvsim accepts (a faster-than-modelled engine is what the factor means). The profile's
name is kept: a perturbed engine still reports the profile it was asked to play.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from .profiles import Profile

ENV = "KVSIM_PERTURB"
MIN_FACTOR = 0.25
MAX_FACTOR = 4.0
MAX_TEXT = 256  # longer text is refused before parsing (it is an environment variable, not a document)


class PerturbationError(ValueError):
    """Invalid perturbation text or factor; the message is one line naming the source and the key."""


@dataclass(frozen=True)
class Perturbation:
    """Multipliers on a profile (1.0 = unchanged); see the module docstring for each one's direction."""

    decode: float = 1.0
    prefill: float = 1.0
    overhead: float = 1.0
    per_seq: float = 1.0
    memory: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_factor(getattr(self, f.name), f.name, "Perturbation")

    @property
    def is_identity(self) -> bool:
        return all(getattr(self, f.name) == 1.0 for f in fields(self))

    def apply(self, profile: Profile) -> Profile:
        """``profile`` with its calibration and GPU memory multiplied; the identity returns ``profile`` itself."""
        if self.is_identity:
            return profile
        cal = profile.calibration
        calibration = replace(
            cal, hbm_efficiency=cal.hbm_efficiency * self.decode, prefill_mfu=cal.prefill_mfu * self.prefill,
            step_overhead_s=cal.step_overhead_s * self.overhead, per_sequence_s=cal.per_sequence_s * self.per_seq)
        gpu = replace(profile.gpu, memory_bytes=int(profile.gpu.memory_bytes * self.memory))
        return replace(profile, calibration=calibration, gpu=gpu)

    def to_text(self) -> str:
        """The canonical text form (only the factors that differ from 1; "" for the identity)."""
        return ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self) if getattr(self, f.name) != 1.0)

    @classmethod
    def parse(cls, text: str, source: str = ENV) -> Perturbation:
        """``key=factor[,key=factor...]`` -> a Perturbation; PerturbationError naming ``source`` and the key."""
        if not isinstance(text, str):
            raise PerturbationError(f"{source} must be text, got {type(text).__name__}")
        if len(text) > MAX_TEXT:
            raise PerturbationError(f"{source} is {len(text)} characters long; at most {MAX_TEXT}")
        known = [f.name for f in fields(cls)]
        values: dict[str, float] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                if text.strip():
                    raise PerturbationError(f"{source}: an empty item; write key=factor[,key=factor...]")
                continue
            key, sep, raw = (s.strip() for s in item.partition("="))
            if not sep:
                raise PerturbationError(f"{source}: {_show(item)} is not key=factor (keys: {', '.join(known)})")
            if key not in known:
                raise PerturbationError(f"{source}: unknown key {_show(key)}; the keys are {', '.join(known)}")
            if key in values:
                raise PerturbationError(f"{source}: key {key} is given twice")
            try:
                value = float(raw)
            except ValueError:
                raise PerturbationError(f"{source}: {key}={_show(raw)} is not a number") from None
            _check_factor(value, key, source)
            values[key] = value
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Perturbation:
        """The perturbation ``KVSIM_PERTURB`` asks for (the identity when it is unset or empty)."""
        return cls.parse(environ.get(ENV) or "", ENV)


def _check_factor(value: object, key: str, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PerturbationError(f"{source}: {key} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise PerturbationError(f"{source}: {key}={value} is not a finite number")
    if not MIN_FACTOR <= value <= MAX_FACTOR:
        raise PerturbationError(f"{source}: {key}={value:g} is outside [{MIN_FACTOR:g}, {MAX_FACTOR:g}]")


def _show(text: str) -> str:
    """``text`` quoted and cut short, printable on one line (it came from an environment variable)."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    return ascii(shown)
