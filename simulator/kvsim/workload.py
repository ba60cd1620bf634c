"""Workloads as YAML, turned into a deterministic request stream (same seed, same requests).

    name: chat
    seed: 7
    arrivals:                        # phases in order; a phase may override the length distributions
      - {durationSeconds: 900, process: poisson, ratePerSecond: 5}
      - {durationSeconds: 900, process: gamma, ratePerSecond: 8, cv: 3,
         inputTokens: {distribution: lognormal, mean: 4000, median: 3500, min: 100, max: 7000}}
    inputTokens:  {distribution: lognormal, mean: 1155, median: 1020, min: 16, max: 8000}
    outputTokens: {distribution: lognormal, mean: 211, median: 129, min: 1, max: 2048}
    maxTokens: 2048                  # max_new_tokens each request asks for (what GUARANTEED_NO_EVICT reserves)
    sharedPrefix: {groups: 8, tokens: 512, fraction: 0.5}   # optional: system prompts block reuse can share

Distributions: ``lognormal`` (mean, median: mu = ln median, sigma^2 = 2 ln(mean/median)), ``fixed`` (value),
``uniform`` (min, max), ``empirical`` (values[, weights]); ``min``/``max`` clamp every one. Processes:
``poisson`` (exponential gaps), ``gamma`` (gaps with coefficient of variation ``cv``; shape 1/cv^2),
``constant`` (evenly spaced). Names without a path resolve to the YAML files bundled in kvsim/workloads/.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .request import Request

PROCESSES = ("poisson", "gamma", "constant")
DISTRIBUTIONS = ("lognormal", "fixed", "uniform", "empirical")


class WorkloadError(ValueError):
    """A workload file that does not say what must hold."""


@dataclass(frozen=True)
class LengthDistribution:
    kind: str
    params: dict[str, Any]
    low: int = 1
    high: int | None = None

    @classmethod
    def parse(cls, spec: dict[str, Any], where: str) -> LengthDistribution:
        if not isinstance(spec, dict) or "distribution" not in spec:
            raise WorkloadError(f"{where} must be a mapping with a 'distribution' field")
        kind = spec["distribution"]
        if kind not in DISTRIBUTIONS:
            raise WorkloadError(f"{where}.distribution must be one of {DISTRIBUTIONS}, got {kind!r}")
        required = {"lognormal": ("mean", "median"), "fixed": ("value",), "uniform": ("min", "max"),
                    "empirical": ("values",)}[kind]
        missing = [k for k in required if k not in spec]
        if missing:
            raise WorkloadError(f"{where}: distribution {kind} needs {', '.join(missing)}")
        for key in ("mean", "median", "value", "min", "max"):
            if key in spec:
                _number(spec[key], f"{where}.{key}")
        if kind == "empirical":
            values = spec["values"]
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                raise WorkloadError(f"{where}.values must be a list of numbers, got {values!r:.60}")
            weights = spec.get("weights")
            if weights is not None and (not isinstance(weights, list) or len(weights) != len(values)
                                        or not all(_is_number(w) and w >= 0 for w in weights)):
                raise WorkloadError(f"{where}.weights must be a list of numbers >= 0, one per value")
        if kind == "lognormal" and not 0 < spec["median"] <= spec["mean"]:
            raise WorkloadError(f"{where}: lognormal needs 0 < median <= mean, got median {spec['median']} "
                                f"and mean {spec['mean']}")
        if kind == "empirical" and not spec["values"]:
            raise WorkloadError(f"{where}.values must not be empty")
        low, high = int(spec.get("min", 1)), spec.get("max")
        if low < 1 or (high is not None and int(high) < low):
            raise WorkloadError(f"{where}: need 1 <= min <= max, got min {low} max {high}")
        return cls(kind, dict(spec), low, None if high is None else int(high))

    def sample(self, rng: random.Random) -> int:
        p = self.params
        if self.kind == "lognormal":
            mu = math.log(p["median"])
            sigma = math.sqrt(max(0.0, 2.0 * math.log(p["mean"] / p["median"])))
            value = rng.lognormvariate(mu, sigma)
        elif self.kind == "fixed":
            value = p["value"]
        elif self.kind == "uniform":
            value = rng.randint(int(p["min"]), int(p["max"]))
        else:
            value = rng.choices(p["values"], weights=p.get("weights"))[0]
        value = max(self.low, round(value))
        return value if self.high is None else min(self.high, value)


@dataclass(frozen=True)
class Phase:
    duration_s: float
    process: str
    rate_per_s: float
    cv: float = 1.0
    input_tokens: LengthDistribution | None = None
    output_tokens: LengthDistribution | None = None
    max_tokens: int | None = None

    def next_gap(self, rng: random.Random, rate: float) -> float:
        if self.process == "poisson":
            return rng.expovariate(rate)
        if self.process == "gamma":
            shape = 1.0 / (self.cv * self.cv)
            return rng.gammavariate(shape, 1.0 / (rate * shape))
        return 1.0 / rate


@dataclass(frozen=True)
class SharedPrefix:
    groups: int
    tokens: int
    fraction: float


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    phases: tuple[Phase, ...]
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    max_tokens: int | None
    shared_prefix: SharedPrefix | None = None
    source: str = field(default="", compare=False)

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def requests(self, duration_s: float | None = None, rate_scale: float = 1.0,
                 seed: int | None = None) -> list[Request]:
        """The request stream: phases in order (repeated if ``duration_s`` is longer), rates times
        ``rate_scale``. Output lengths never exceed maxTokens (a request stops at max_new_tokens)."""
        if rate_scale <= 0:
            raise WorkloadError(f"rate_scale must be > 0, got {rate_scale}")
        rng = random.Random(self.seed if seed is None else seed)
        end = self.duration_s if duration_s is None else duration_s
        out: list[Request] = []
        phase_start, i = 0.0, 0
        while phase_start < end:
            phase = self.phases[i % len(self.phases)]
            phase_end = min(end, phase_start + phase.duration_s)
            rate = phase.rate_per_s * rate_scale
            t = phase_start
            while rate > 0:
                t += phase.next_gap(rng, rate)
                if t >= phase_end:
                    break
                out.append(self._request(rng, phase, t, len(out)))
            phase_start += phase.duration_s
            i += 1
        return out

    def _request(self, rng: random.Random, phase: Phase, t: float, index: int) -> Request:
        prompt = (phase.input_tokens or self.input_tokens).sample(rng)
        output = (phase.output_tokens or self.output_tokens).sample(rng)
        max_tokens = phase.max_tokens or self.max_tokens
        if max_tokens is not None:
            output = min(output, max_tokens)
        prefix_id, prefix_tokens = None, 0
        sp = self.shared_prefix
        if sp is not None and rng.random() < sp.fraction:
            prefix_id = f"{self.name}-prefix-{rng.randrange(sp.groups)}"
            prefix_tokens = min(sp.tokens, prompt)
        return Request(prompt_tokens=prompt, output_tokens=output, max_tokens=max_tokens, arrival_s=t,
                       request_id=index, prefix_id=prefix_id, prefix_tokens=prefix_tokens)


def parse_workload(doc: dict[str, Any], source: str = "<dict>") -> Workload:
    """Validate a workload mapping; errors name the field and what must hold."""
    if not isinstance(doc, dict):
        raise WorkloadError(f"workload {source} must be a mapping")
    for key in ("name", "arrivals", "inputTokens", "outputTokens"):
        if key not in doc:
            raise WorkloadError(f"workload {source}: field {key!r} is required")
    if not isinstance(doc["arrivals"], list) or not doc["arrivals"]:
        raise WorkloadError(f"workload {source}: arrivals must be a non-empty list of phases")
    phases = []
    for n, ph in enumerate(doc["arrivals"]):
        where = f"workload {source}: arrivals[{n}]"
        if not isinstance(ph, dict):
            raise WorkloadError(f"{where} must be a mapping (durationSeconds, ratePerSecond, ...)")
        for key in ("durationSeconds", "ratePerSecond", "cv", "maxTokens"):
            if key in ph:
                _number(ph[key], f"{where}.{key}")
        process = ph.get("process", "poisson")
        if process not in PROCESSES:
            raise WorkloadError(f"{where}.process must be one of {PROCESSES}, got {process!r}")
        duration, rate = float(ph.get("durationSeconds", 0)), float(ph.get("ratePerSecond", -1))
        if duration <= 0 or rate < 0:
            raise WorkloadError(f"{where} needs durationSeconds > 0 and ratePerSecond >= 0")
        cv = float(ph.get("cv", 1.0))
        if process == "gamma" and cv <= 0:
            raise WorkloadError(f"{where}.cv must be > 0 for a gamma process")
        phases.append(Phase(
            duration, process, rate, cv,
            LengthDistribution.parse(ph["inputTokens"], f"{where}.inputTokens") if "inputTokens" in ph else None,
            LengthDistribution.parse(ph["outputTokens"], f"{where}.outputTokens") if "outputTokens" in ph else None,
            int(ph["maxTokens"]) if "maxTokens" in ph else None))
    prefix = None
    if "sharedPrefix" in doc:
        sp = doc["sharedPrefix"]
        if not isinstance(sp, dict):
            raise WorkloadError(f"workload {source}: sharedPrefix must be a mapping (groups, tokens, fraction)")
        for key in ("groups", "tokens", "fraction"):
            if key in sp:
                _number(sp[key], f"workload {source}: sharedPrefix.{key}")
        prefix = SharedPrefix(int(sp.get("groups", 1)), int(sp.get("tokens", 0)), float(sp.get("fraction", 1.0)))
        if prefix.groups < 1 or prefix.tokens < 0 or not 0 <= prefix.fraction <= 1:
            raise WorkloadError(f"workload {source}: sharedPrefix needs groups >= 1, tokens >= 0, 0 <= fraction <= 1")
    max_tokens = doc.get("maxTokens")
    for key in ("seed", "maxTokens"):
        if doc.get(key) is not None:
            _number(doc[key], f"workload {source}: {key}")
    if max_tokens is not None and int(max_tokens) < 1:
        raise WorkloadError(f"workload {source}: maxTokens must be >= 1")
    return Workload(
        name=str(doc["name"]), seed=int(doc.get("seed", 0)), phases=tuple(phases),
        input_tokens=LengthDistribution.parse(doc["inputTokens"], f"workload {source}: inputTokens"),
        output_tokens=LengthDistribution.parse(doc["outputTokens"], f"workload {source}: outputTokens"),
        max_tokens=None if max_tokens is None else int(max_tokens), shared_prefix=prefix, source=source)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any, where: str) -> None:
    """A YAML number (``"12"`` or ``yes`` is a mistake worth naming, not a float() error without a field)."""
    if not _is_number(value):
        raise WorkloadError(f"{where} must be a finite number, got {value!r:.60}")


def bundled_workloads() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("kvsim.workloads").iterdir() if p.name.endswith(".yaml"))


def load_workload(path_or_name: str | Path) -> Workload:
    """Load a workload from a YAML path, or by name from the bundled set (``chat``, ``code``, ...)."""
    path = Path(path_or_name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        source = str(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"workload {source}: cannot read the file: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None
    else:
        resource = resources.files("kvsim.workloads").joinpath(f"{path_or_name}.yaml")
        if not resource.is_file():
            raise WorkloadError(f"workload {path_or_name!r} is neither a file nor bundled; bundled: "
                                f"{bundled_workloads()}")
        text, source = resource.read_text(), f"{path_or_name} (bundled)"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WorkloadError(f"workload {source} is not YAML: {_yaml_problem(exc)}") from None
    return parse_workload(doc, source)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint on one line (its own message spans several, with a caret drawing)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)
