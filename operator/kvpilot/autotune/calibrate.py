"""Fits kvsim's engine parameters to the engine the pods run, from what the pods report (issue 18, section 3).

A kvsim profile is a datasheet: kvsim's own error against NVIDIA's published tables is 6.6% in median and 28%
at worst, and a served engine may decode 20% slower than its profile. The tuner's what-if must simulate the
engine it watches, so this module fits kvsim's four calibrated numbers (``kvsim.profiles.Calibration``) to the
iteration latencies the pods report, on the profile's own physics (``kvsim.latency``). One iteration takes

    t = max(w W, l G N) + k K kv + l H A + c0 + c1 n + all-reduce

where W, K, G, H are the profile's costs at unit efficiency (a decode step's weight stream over the HBM
bandwidth, one KV token's read, one token's GEMM FLOPs and the causal attention over the tensor peak), N the
iteration's tokens, kv the KV tokens it reads, A the attention work of its context chunks, n the sequences it
schedules. kvsim has w = k = 1/hbm_efficiency, l = 1/prefill_mfu, c0 = step_overhead_s, c1 = per_sequence_s.
Once the branch of the max is known, t is linear in (w, k, l, c0, c1): a recursive weighted least squares fits
them, in units of the profile's values (1 is the datasheet), regularized toward 1 (the profile is the prior:
a direction the traffic leaves unidentified, such as c0 against the weight stream in pure decode, stays at
the datasheet), and bounded. For a profile kvsim knows, w and k are one parameter (one HBM efficiency); for a
template standing in for an unknown engine (``engine_model.py``) they are two, since the template's ratio of
weight bytes to KV bytes is not the engine's.

What a pod reports per iteration (TensorRT backend, ``/metrics``): ``iterLatencyMS``, the generation and
context requests and context tokens (``inflightBatchingStats``), the KV blocks used (``kvCacheStats``) and
``iter``. The PyTorch backend leaves ``inflightBatchingStats`` empty (shared/reference/trtllm-forward.md
section 2): there the active requests stand for the generation batch and the window's prompt tokens (from the
request counters) are shared among the iterations clearly slower than decoding alone.

Robust: a sample whose latency or counts are not finite and non-negative is dropped; a counter that goes back
(a restarted pod) starts its chain again; each row's weight is Huber's (bounded influence), and a latency more
than ``REJECT`` (relative) away from the fit is dropped as hostile. Bounded: the state is the normal equations
(5 x 5), a few scalars, at most ``MAX_PODS`` iteration counters and ``MAX_POOLS`` pool sizes, whatever the
traffic. Past evidence decays with a half-life (``HALF_LIFE_S``), so the fit follows an engine that changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kvsim import Calibration, Profile

from kvpilot.autotune.iterations import (
    IterationReader,
    IterationSample,
    PromptWork,
    Row,
    predict,
    weighted_median,
)

__all__ = ["EngineFit", "FitResult", "IterationSample", "PromptWork", "WindowCheck"]

HALF_LIFE_S = 1800.0  # evidence half a planning horizon old counts half
PRIOR_ROWS = 1.0  # the profile's values weigh as much as one iteration made of that term alone
TEMPLATE_PRIOR_ROWS = 0.01  # a template's values are a guess: they only settle what the traffic leaves open
HUBER = 2.5  # rows beyond HUBER x the residual scale get weight HUBER x scale / |residual|
REJECT = 2.0  # a latency 3x off the window's other iterations (relative to the fit) is a hostile or broken pod
MIN_ITERATIONS = 300.0  # effective iterations before the fit is reported ready
MIN_WINDOWS = 3
ERROR_SMOOTHING = 0.3  # weight of the newest window in the model's running error
# Bounds on the fitted values, in units of the profile's: efficiencies within 5x of the datasheet; fixed and
# per-sequence costs from 0 to 100x (a Python scheduler costs milliseconds per step, not 0.25 ms).
BOUNDS = {"w": (0.2, 5.0), "k": (0.2, 5.0), "l": (0.2, 5.0), "c0": (0.0, 100.0), "c1": (0.0, 100.0)}
# A template stands for a GPU and model kvsim does not know: an L4 streams 11x slower than the H100 template.
TEMPLATE_BOUNDS = {**BOUNDS, "w": (0.02, 50.0), "k": (0.02, 50.0), "l": (0.02, 50.0), "c0": (0.0, 1000.0),
                   "c1": (0.0, 1000.0)}
MIN_C0_S = 1e-5  # a template with no fixed cost still gets a column to fit one
MIN_C1_S = 1e-8


@dataclass(frozen=True)
class WindowCheck:
    """How one window's iterations compare with the fit as it stood before them (a prediction, not a fit),
    and with the profile itself (the error before fitting)."""

    iterations: float = 0.0
    measured_ms: float = 0.0  # mean iteration latency measured
    predicted_ms: float = 0.0  # ... predicted by the fit before this window
    nominal_ms: float = 0.0  # ... predicted by the profile's datasheet values
    rejected: int = 0
    per_token: bool = True  # the samples carried per-iteration token counts (TensorRT backend)

    @property
    def error(self) -> float | None:
        """Relative error of the predicted mean iteration latency; None without iterations."""
        return self.predicted_ms / self.measured_ms - 1.0 if self.iterations and self.measured_ms > 0 else None

    @property
    def nominal_error(self) -> float | None:
        return self.nominal_ms / self.measured_ms - 1.0 if self.iterations and self.measured_ms > 0 else None


@dataclass(frozen=True)
class FitResult:
    """The fitted engine: kvsim's calibration for it, the KV pool it showed, and how well the fit predicts."""

    calibration: Calibration
    weights_scale: float  # the weight stream relative to the profile's at the fitted HBM efficiency (1: known)
    pool_tokens: tuple[tuple[int, int], ...]  # (runtime max_batch_size, KV tokens in one pod's pool), newest last
    tokens_per_block: int
    iterations: float  # effective (decayed) iterations behind the fit
    windows: int
    latency_error: float | None  # running mean |relative error| of each window's predicted mean iteration latency
    nominal_error: float | None  # the same for the datasheet profile (before fitting)
    per_token: bool  # fitted from per-iteration token counts (False: the PyTorch fallback)

    @property
    def ready(self) -> bool:
        return self.iterations >= MIN_ITERATIONS and self.windows >= MIN_WINDOWS and self.latency_error is not None


class EngineFit:
    """The running fit of one engine (all its pods: one engine, one set of parameters)."""

    def __init__(self, profile: Profile, *, known: bool = True, half_life_s: float = HALF_LIFE_S,
                 max_num_tokens: int = 8192) -> None:
        """``profile``: the kvsim profile of the pods (or, ``known=False``, the template standing in for an
        engine kvsim has no profile of: its weight stream is then fitted apart from its KV reads)."""
        self.profile = profile
        self.known = known
        self.half_life_s = half_life_s
        self.max_num_tokens = max(1, max_num_tokens)
        cal = profile.calibration
        self._theta0 = {"w": 1.0 / cal.hbm_efficiency, "k": 1.0 / cal.hbm_efficiency, "l": 1.0 / cal.prefill_mfu,
                        "c0": max(MIN_C0_S, cal.step_overhead_s), "c1": max(MIN_C1_S, cal.per_sequence_s)}
        self._names = ("k", "l", "c0", "c1") if known else ("w", "k", "l", "c0", "c1")
        p = len(self._names)
        self._u = [1.0] * p
        self._ata = [[0.0] * p for _ in range(p)]
        self._atb = [0.0] * p
        self._weight = 0.0
        self._scale = 0.05
        self._at: float | None = None
        self.reader = IterationReader(profile, self.max_num_tokens)
        self._windows = 0
        self._error: float | None = None
        self._nominal_error: float | None = None
        self._per_token = True

    # -- input -------------------------------------------------------------------------------------------
    def observe(self, samples_by_pod: Mapping[str, Sequence[IterationSample]], now_s: float, limit: int = 0,
                context_by_pod: Mapping[str, PromptWork] | None = None) -> WindowCheck:
        """Add one window of samples. ``limit``: the runtime max_batch_size in force where a sample does not say
        (PyTorch reports 0). ``context_by_pod``: the prompts each pod computed in the window, for samples
        without per-iteration token counts (from the request counters; None: unknown)."""
        self._decay(now_s)
        rows: list[Row] = []
        rejected = 0
        per_token = True
        for pod, samples in samples_by_pod.items():
            pod_rows, bad, shaped = self.reader.rows(pod, samples, limit, (context_by_pod or {}).get(pod),
                                                     self._theta(), self._scale)
            rows += pod_rows
            rejected += bad
            per_token = per_token and shaped
        check = self._check(rows, rejected, per_token)
        rejected += self._accumulate(rows)
        if rows:
            self._solve()
            self._windows += 1
            self._per_token = per_token
            if check.error is not None and check.nominal_error is not None:
                self._error = _smooth(self._error, abs(check.error))
                self._nominal_error = _smooth(self._nominal_error, abs(check.nominal_error))
        return replace(check, rejected=rejected)

    def _decay(self, now_s: float) -> None:
        if not math.isfinite(now_s):
            return
        if self._at is not None and now_s > self._at:
            factor = 0.5 ** ((now_s - self._at) / self.half_life_s)
            self._ata = [[v * factor for v in row] for row in self._ata]
            self._atb = [v * factor for v in self._atb]
            self._weight *= factor
            self.reader.decay(factor)
        if self._at is None or now_s > self._at:
            self._at = now_s

    # -- the model ---------------------------------------------------------------------------------------
    def _theta(self, u: Sequence[float] | None = None) -> dict[str, float]:
        values = dict(zip(self._names, u if u is not None else self._u))
        theta = {n: self._theta0[n] * values.get(n, 1.0) for n in self._theta0}
        if self.known:
            theta["w"] = theta["k"]
        return theta

    def _columns(self, row: Row, theta: Mapping[str, float]) -> list[float]:
        """The row's terms per fitted parameter (seconds at the profile's values), on the max's current branch."""
        compute = theta["l"] * row.gemm > theta["w"] * row.weights
        t0 = self._theta0
        terms = {"w": 0.0 if compute else t0["w"] * row.weights, "k": t0["k"] * row.kv,
                 "l": t0["l"] * ((row.gemm if compute else 0.0) + row.attention),
                 "c0": t0["c0"], "c1": t0["c1"] * row.sequences}
        if self.known:
            terms["k"] += terms["w"]
        return [terms[n] for n in self._names]

    def _check(self, rows: list[Row], rejected: int, per_token: bool) -> WindowCheck:
        theta, nominal = self._theta(), self._theta([1.0] * len(self._names))
        n = sum(r.iterations for r in rows)
        if not n:
            return WindowCheck(rejected=rejected, per_token=per_token)
        measured = sum(r.iterations * r.latency_s for r in rows) / n
        predicted = sum(r.iterations * predict(r, theta) for r in rows) / n
        base = sum(r.iterations * predict(r, nominal) for r in rows) / n
        return WindowCheck(n, measured * 1e3, predicted * 1e3, base * 1e3, rejected, per_token)

    def _accumulate(self, rows: list[Row]) -> int:
        """Add the rows to the normal equations (relative residuals, Huber weights); returns those dropped."""
        theta = self._theta()
        dropped = 0
        predictions = [predict(row, theta) for row in rows]
        # Hostile means far from the window's other iterations, not from the fit: a template that starts 10x
        # off (another GPU) must still learn from every row.
        ratios = [(row.latency_s / p, row.iterations) for row, p in zip(rows, predictions)
                  if p > 0 and math.isfinite(row.latency_s / p)]
        bulk = weighted_median([x for x, _ in ratios], [w for _, w in ratios]) if ratios else 1.0
        for row, predicted in zip(rows, predictions):
            if not predicted > 0:
                dropped += 1
                continue
            r = (row.latency_s - predicted) / predicted
            if not math.isfinite(r) or not bulk / (1 + REJECT) <= 1 + r <= bulk * (1 + REJECT):
                dropped += 1
                continue
            huber = 1.0 if abs(r) <= HUBER * self._scale else HUBER * self._scale / abs(r)
            self._scale = 0.98 * self._scale + 0.02 * max(0.005, min(abs(r), 1.0))
            weight = row.iterations * huber / (predicted * predicted)
            cols = self._columns(row, theta)
            y = row.latency_s - row.known_s
            for i, ci in enumerate(cols):
                if ci:
                    self._atb[i] += weight * ci * y
                    line = self._ata[i]
                    for j, cj in enumerate(cols):
                        line[j] += weight * ci * cj
            self._weight += row.iterations * huber
        return dropped

    def _solve(self) -> None:
        """Regularized least squares toward the profile (u = 1), each value clamped to its bounds."""
        p = len(self._names)
        free = list(range(p))
        u = [1.0] * p
        for _ in range(p + 1):
            prior = PRIOR_ROWS if self.known else TEMPLATE_PRIOR_ROWS
            matrix = [[self._ata[i][j] + (prior if i == j else 0.0) for j in free] for i in free]
            rhs = [self._atb[i] + prior - sum(self._ata[i][j] * u[j] for j in range(p) if j not in free)
                   for i in free]
            solved = _gauss(matrix, rhs)
            if solved is None:
                return
            for idx, value in zip(free, solved):
                u[idx] = value
            bounds = BOUNDS if self.known else TEMPLATE_BOUNDS
            out = [i for i in free if not bounds[self._names[i]][0] <= u[i] <= bounds[self._names[i]][1]]
            if not out:
                break
            for i in out:
                lo, hi = bounds[self._names[i]]
                u[i] = min(hi, max(lo, u[i]))
                free.remove(i)
            if not free:
                break
        self._u = u

    # -- output ------------------------------------------------------------------------------------------
    def result(self) -> FitResult:
        theta = self._theta()
        u = dict(zip(self._names, self._u))
        nominal = self.profile.calibration
        calibration = Calibration(hbm_efficiency=nominal.hbm_efficiency / u["k"],
                                  prefill_mfu=nominal.prefill_mfu / u["l"], step_overhead_s=theta["c0"],
                                  per_sequence_s=theta["c1"])
        return FitResult(calibration=calibration, weights_scale=theta["w"] / theta["k"],
                         pool_tokens=self.reader.pools, tokens_per_block=self.reader.tokens_per_block,
                         iterations=self._weight, windows=self._windows, latency_error=self._error,
                         nominal_error=self._nominal_error, per_token=self._per_token)


def _smooth(previous: float | None, value: float) -> float:
    return value if previous is None else (1 - ERROR_SMOOTHING) * previous + ERROR_SMOOTHING * value


def _gauss(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Solve a small dense system by Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    a = [row[:] + [b] for row, b in zip(matrix, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            if f:
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out if all(math.isfinite(v) for v in out) else None
