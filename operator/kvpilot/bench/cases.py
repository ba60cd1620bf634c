"""The suite's cases: a workload on a kvsim profile with SLOs, each 30 minutes long (docs/tuner-suite.md).

Each case covers a part of the space where the knob does not matter as well as where it does: light load,
overload with a tight TPOT objective, long outputs, KV-scarce long contexts under MaxUtilization, phase shifts,
bursty arrivals, 70B tensor-parallel engines and a ramp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim import Request
from kvsim.workload import parse_workload

# The gateway sheds a request not scheduled within this share of the case's TTFT objective (docs/tuner-suite.md,
# "Queue model"); clients that see no token give up after the fleet's client timeout either way.
QUEUE_TIMEOUT_SHARE = 0.5
# Every case runs 30 minutes (the issue's own example is 10 + 20 minutes): a tuner is run over a workload that
# lasts, and in 10-minute runs one detection interval plus one 90 s rollout was a fifth of the run, which no
# tuner that must first see the need can win back (docs/tuner-suite.md keeps the 10-minute figures). The phases
# keep their shares of the run.
CASE_SECONDS = 1800.0


def _lognormal(mean: int, median: int, high: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"distribution": "lognormal", "mean": mean, "median": median}
    if high:
        out["max"] = high
    return out


@dataclass(frozen=True)
class Case:
    name: str
    profile: str
    covers: str  # which part of the coverage the case stands for
    phases: tuple[tuple[float, float], ...]  # (seconds, requests per second)
    prompt: tuple[int, int]  # lognormal (mean, median)
    output: tuple[int, int]
    max_tokens: int
    ttft_ms: float
    tpot_ms: float
    replicas: int = 2
    restart_s: float = 90.0
    policy: str = "GuaranteedNoEvict"
    process: str = "poisson"
    cv: float = 1.0
    seed: int = 7
    prompt_cap: int | None = None
    steady: bool = True  # one phase: at most one change after settling is allowed
    # The cluster has free GPUs of the pods' product for every replica (2 one- or two-GPU replicas on an 8-GPU
    # node), so the tuner's `rollout.strategy: Auto` rolls with maxSurge 2 / maxUnavailable 0 (both new pods
    # start at once); False: no spare, maxSurge 0.
    spare_gpu: bool = True
    # The TensorRT-LLM backend the pods run (kvsim plays either): tensorrt (a built engine, the in-engine batch
    # tuner) or pytorch (no engine, CUDA graphs, no in-engine tuner); ``--backend`` of the suite.
    backend: str = "tensorrt"
    # The tuner's autotune.canary (Auto: a change it proposes for a gain is tried on one pod first where the rollout
    # cannot restart every pod at once; Always; Off, the product's default; bench/canary_fleet.py); ``--canary``.
    canary: str = "Off"
    extra: dict[str, Any] = field(default_factory=dict)
    # Per phase, (prompt, output) lognormal (mean, median) in place of ``prompt``/``output`` (the traffic mix
    # changes, not only its rate); empty: every phase draws from ``prompt``/``output``.
    phase_lengths: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = ()

    def requests(self) -> list[Request]:
        if self.phase_lengths and len(self.phase_lengths) != len(self.phases):
            raise ValueError(f"suite case {self.name}: phase_lengths has {len(self.phase_lengths)} entries, "
                             f"phases {len(self.phases)}; give one (prompt, output) per phase or none")
        arrivals: list[dict[str, Any]] = []
        for k, (d, r) in enumerate(self.phases):
            phase: dict[str, Any] = {"durationSeconds": d, "ratePerSecond": r, "process": self.process, "cv": self.cv}
            if self.phase_lengths:
                prompt, output = self.phase_lengths[k]
                phase["inputTokens"] = _lognormal(*prompt, self.prompt_cap)
                phase["outputTokens"] = _lognormal(*output)
            arrivals.append(phase)
        doc = {
            "name": self.name, "seed": self.seed, "maxTokens": self.max_tokens,
            "inputTokens": _lognormal(*self.prompt, self.prompt_cap),
            "outputTokens": _lognormal(*self.output),
            "arrivals": arrivals,
        }
        return parse_workload(doc, f"suite case {self.name}").requests()

    @property
    def queue_timeout_s(self) -> float:
        return QUEUE_TIMEOUT_SHARE * self.ttft_ms / 1e3

    @property
    def duration_s(self) -> float:
        return sum(d for d, _ in self.phases)

    @property
    def boundaries(self) -> list[float]:
        out, t = [], 0.0
        for d, _ in self.phases[:-1]:
            t += d
            out.append(t)
        return out


def _phases(*parts: tuple[int, float]) -> tuple[tuple[float, float], ...]:
    """Phases as (weight, requests per second): each lasts its weight's share of CASE_SECONDS, the last one
    the remainder, so the run's length is stated once and the phases always add up to it."""
    total = sum(w for w, _ in parts)
    out = [(CASE_SECONDS * w / total, rate) for w, rate in parts[:-1]]
    return (*out, (CASE_SECONDS - sum(d for d, _ in out), parts[-1][1]))


CASES: tuple[Case, ...] = (
    Case("light-chat", "llama-3.1-8b-fp8-h100", "light load: nothing to change",
         _phases((1, 4.0)), (600, 400), (250, 180), 1024, 2000, 50),
    Case("light-a100", "llama-3.1-8b-bf16-a100", "light load on A100",
         _phases((1, 2.0)), (800, 500), (300, 220), 1024, 3000, 60),
    Case("light-l4", "llama-3.1-8b-fp8-l4", "light load on a 24 GB GPU",
         _phases((1, 1.0)), (800, 500), (250, 180), 1024, 3000, 80),
    Case("tight-tpot-overload", "llama-3.1-8b-bf16-a100", "overload with a tight TPOT objective (interior optimum)",
         _phases((1, 28.0)), (300, 200), (300, 200), 1024, 3000, 22),
    Case("long-output-a100", "llama-3.1-8b-bf16-a100", "high rate, long outputs: 64 is too low",
         _phases((1, 30.0)), (150, 120), (600, 450), 1024, 3000, 60),
    Case("long-output-l40s", "llama-3.1-8b-fp8-l40s", "64 too low on a 48 GB GPU",
         _phases((1, 36.0)), (150, 120), (600, 450), 1024, 3000, 60),
    Case("longctx-maxutil-l4", "llama-3.1-8b-fp8-l4", "long context, KV-scarce 24 GB, MaxUtilization (pausing)",
         _phases((1, 0.4)), (6000, 4000), (400, 300), 1024, 10000, 80, policy="MaxUtilization", prompt_cap=30000),
    Case("longctx-maxutil-l40s", "llama-3.1-8b-fp8-l40s", "long context, KV-scarce 48 GB, MaxUtilization",
         _phases((1, 2.0)), (6000, 4000), (400, 300), 1024, 8000, 60, policy="MaxUtilization", prompt_cap=30000),
    Case("phase-shift-l40s", "llama-3.1-8b-fp8-l40s", "phase shift: light long prompts, then many long outputs",
         _phases((1, 2.0), (1, 36.0)), (200, 150), (600, 450), 1024, 3000, 60, steady=False),
    Case("burst-a100", "llama-3.1-8b-bf16-a100", "bursty arrivals (gamma, cv 3)",
         _phases((1, 8.0)), (800, 500), (300, 220), 1024, 3000, 60, process="gamma", cv=3.0),
    Case("70b-tp2-4to12", "llama-3.1-70b-fp8-h100-tp2", "issue case: 70B TP2, 4 then 12 req/s",
         _phases((1, 4.0), (2, 12.0)), (700, 500), (300, 220), 1024, 3000, 40, steady=False),
    Case("70b-tp2-steady", "llama-3.1-70b-fp8-h100-tp2", "70B tensor-parallel, steady",
         _phases((1, 6.0)), (700, 500), (300, 220), 1024, 3000, 40),
    Case("ramp-a100", "llama-3.1-8b-bf16-a100", "issue case: held-out ramp on A100",
         _phases((1, 2.0), (1, 6.0), (1, 12.0), (1, 20.0), (1, 28.0)), (700, 500), (300, 220), 1024, 3000, 60,
         steady=False),
    # The traffic mix shifts on one A100 pool under one SLO pair: chat with long answers at 30 req/s (the
    # long-output-a100 traffic: 64 is too low, 256 best) and document Q&A with ~2000-token retrieved contexts at
    # 8 req/s (16k prompt tokens/s, more than the pool serves in time: with a limit of 128 or more so many long
    # prefills share the decode steps that most requests miss the 60 ms TPOT; 32 admits fewer and serves them in
    # time). Both orders: the tuner must lower after a raise, or raise after a lower (docs/tuner-suite.md).
    Case("chat-then-rag-a100", "llama-3.1-8b-bf16-a100",
         "phase shift, best value differs per phase: long-output chat (high limit), then long-prompt RAG (low)",
         _phases((1, 30.0), (1, 8.0)), (150, 120), (600, 450), 1024, 3000, 60, steady=False, prompt_cap=8000,
         phase_lengths=(((150, 120), (600, 450)), ((2000, 1500), (300, 200)))),
    Case("rag-then-chat-a100", "llama-3.1-8b-bf16-a100",
         "phase shift, best value differs per phase: long-prompt RAG (low limit), then long-output chat (high)",
         _phases((1, 8.0), (1, 30.0)), (2000, 1500), (300, 200), 1024, 3000, 60, steady=False, prompt_cap=8000,
         phase_lengths=(((2000, 1500), (300, 200)), ((150, 120), (600, 450)))),
)


def case_named(name: str) -> Case:
    """The case called ``name``; KeyError naming the known ones."""
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"unknown suite case {name!r}; cases: {', '.join(c.name for c in CASES)}")
