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
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kvsim import Calibration, Profile
from kvsim.latency import IterationModel

HALF_LIFE_S = 1800.0  # evidence half a planning horizon old counts half
PRIOR_ROWS = 1.0  # the profile's values weigh as much as one iteration made of that term alone
TEMPLATE_PRIOR_ROWS = 0.01  # a template's values are a guess: they only settle what the traffic leaves open
HUBER = 2.5  # rows beyond HUBER x the residual scale get weight HUBER x scale / |residual|
REJECT = 2.0  # a latency 3x off the window's other iterations (relative to the fit) is a hostile or broken pod
MAX_STEP_WEIGHT = 64  # a sample stands for at most this many iterations (its ``iter`` step), whatever it claims
MAX_LATENCY_MS = 1e6
MAX_PODS = 64
MAX_POOLS = 8
MAX_ROWS_PER_WINDOW = 96  # per pod: the fit's CPU is bounded whatever the pod reports (about 1 ms a window)
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
CHUNK_SMOOTHING = 0.01
MAX_CHUNK_SPREAD = 4.0
PREFILL_EXCESS = 3.0  # PyTorch stats: an iteration this many residual scales above the decode model ran prompts


class IterationSample(Protocol):
    """The fields of one iteration's stats the fit reads (``kvpilot.trtllm.metrics.IterationSample`` has them;
    the tuner layer does not import the parser)."""

    @property
    def used_blocks(self) -> int: ...
    @property
    def max_blocks(self) -> int: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def active_requests(self) -> int: ...
    @property
    def max_batch_size_runtime(self) -> int: ...
    @property
    def iter_latency_ms(self) -> float: ...
    @property
    def context_requests(self) -> int: ...
    @property
    def generation_requests(self) -> int: ...
    @property
    def scheduled_requests(self) -> int | None: ...
    @property
    def ctx_tokens(self) -> int: ...
    @property
    def iteration(self) -> int: ...
    @property
    def completed_requests(self) -> int: ...


@dataclass(frozen=True)
class Physics:
    """A profile's per-iteration costs at unit efficiency (seconds; kvsim.latency's terms)."""

    weights_s: float
    kv_s_per_token: float
    linear_s_per_token: float
    attn_s_per_token2: float
    allreduce_fixed_s: float
    allreduce_s_per_token: float

    @classmethod
    def of(cls, profile: Profile, tokens_per_block: int) -> Physics:
        unit = replace(profile, calibration=Calibration(1.0, 1.0, 0.0, 0.0))
        m = IterationModel.for_profile(unit, tokens_per_block)
        return cls(m.weights_s, m.kv_s_per_token, m.linear_s_per_token, m.attn_s_per_token2,
                   m.allreduce_fixed_s, m.allreduce_s_per_token)


@dataclass(frozen=True)
class Row:
    """One iteration as the fit sees it: physics terms (seconds at unit efficiency) and what it measured."""

    weights: float  # W
    kv: float  # K x kv tokens
    gemm: float  # G x N
    attention: float  # H x A
    sequences: float  # n
    known_s: float  # all-reduce: not fitted
    latency_s: float
    iterations: float  # how many iterations the sample stands for


@dataclass(frozen=True)
class PromptWork:
    """The prompts one pod computed in a window: their tokens and how many requests they were (the 1.3
    counters' growth, or the window's traffic fit), for the PyTorch backend's stats, which lack per-iteration
    token counts."""

    tokens: float
    requests: float


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
        self._physics: dict[int, Physics] = {}
        self._last_iter: OrderedDict[str, int] = OrderedDict()
        self._carry: OrderedDict[str, float] = OrderedDict()  # per pod: prompt tokens a chunked prompt computed
        self._pools: OrderedDict[int, int] = OrderedDict()
        self._tpb = 0
        self._windows = 0
        self._error: float | None = None
        self._nominal_error: float | None = None
        self._per_token = True
        self._chunks = [0.0, 0.0]  # running mean of single context chunks and of their squares
        self._prompt_work = [0.0, 0.0]  # PyTorch: prompt tokens the latencies implied, and those the counters saw

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
            pod_rows, bad, shaped = self._rows(pod, samples, limit, (context_by_pod or {}).get(pod))
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
            self._prompt_work = [v * factor for v in self._prompt_work]
        if self._at is None or now_s > self._at:
            self._at = now_s

    def _rows(self, pod: str, samples: Sequence[IterationSample], limit: int,
              context: PromptWork | None) -> tuple[list[Row], int, bool]:
        """The pod's samples as rows; also how many were unusable and whether they carried token counts."""
        good: list[tuple[IterationSample, float]] = []
        bad = 0
        prev = self._last_iter.pop(pod, None)
        last: dict[int, IterationSample] = {}  # the latest sample at each runtime limit: the pool it reports
        for s in samples:
            if not _sane(s):
                bad += 1
                continue
            step = s.iteration - prev if prev is not None and s.iteration > prev else 1
            prev = s.iteration
            last[s.max_batch_size_runtime] = s
            if s.iter_latency_ms > 0 and (s.active_requests > 0 or s.generation_requests + s.context_requests > 0):
                good.append((s, float(min(step, MAX_STEP_WEIGHT))))
        for s in last.values():
            self._note_pool(s, limit)
        if prev is not None:
            self._last_iter[pod] = prev
            while len(self._last_iter) > MAX_PODS:
                self._last_iter.popitem(last=False)
        shaped = any(s.generation_requests + s.context_requests > 0 for s, _ in good)
        if shaped:
            return self._rows_sampled(pod, good), bad, True
        return self._rows_pytorch(_thinned(good, MAX_ROWS_PER_WINDOW), context), bad, not good

    def _rows_sampled(self, pod: str, good: list[tuple[IterationSample, float]]) -> list[Row]:
        """TensorRT rows, at most MAX_ROWS_PER_WINDOW per pod and window (CPU: a busy pod reports a thousand
        iterations a scrape): decode and context iterations thinned apart, each kept one standing for those
        left out, while every context iteration still carries its chunked prompt into the next."""
        ctx = [i for i, (s, _) in enumerate(good) if s.ctx_tokens]
        keep = set(_spaced(ctx, MAX_ROWS_PER_WINDOW // 2))
        decode = [i for i, (s, _) in enumerate(good) if not s.ctx_tokens]
        keep.update(_spaced(decode, MAX_ROWS_PER_WINDOW - len(keep)))
        weight_ctx = len(ctx) / max(1, sum(1 for i in ctx if i in keep))
        weight_decode = len(decode) / max(1, sum(1 for i in decode if i in keep))
        rows, carry = [], self._carry.pop(pod, 0.0)
        for i, (s, k) in enumerate(good):
            if i in keep:
                row, carry = self._row_trt(s, k * (weight_ctx if s.ctx_tokens else weight_decode), carry)
                rows.append(row)
            elif s.ctx_tokens:
                carry = self._attention(s.generation_requests, s.context_requests, s.ctx_tokens, carry,
                                        s.tokens_per_block or 32)[1]
            else:
                carry = 0.0
        self._carry[pod] = carry
        while len(self._carry) > MAX_PODS:
            self._carry.popitem(last=False)
        return rows

    def _note_pool(self, s: IterationSample, limit: int) -> None:
        at = s.max_batch_size_runtime or limit
        if s.max_blocks > 0 and s.tokens_per_block > 0 and at > 0:
            self._pools.pop(at, None)
            self._pools[at] = s.max_blocks * s.tokens_per_block
            while len(self._pools) > MAX_POOLS:
                self._pools.popitem(last=False)
            self._tpb = s.tokens_per_block

    def _phys(self, tokens_per_block: int) -> Physics:
        tpb = tokens_per_block if tokens_per_block > 0 else 32
        if tpb not in self._physics:
            if len(self._physics) >= MAX_POOLS:
                self._physics.clear()
            self._physics[tpb] = Physics.of(self.profile, tpb)
        return self._physics[tpb]

    def _row_trt(self, s: IterationSample, k: float, carry: float) -> tuple[Row, float]:
        """TensorRT backend: the iteration's own generation and context counts. ``carry``: the prompt tokens a
        chunked prompt already computed in the pod's previous iterations; also returns the next one's."""
        ph = self._phys(s.tokens_per_block)
        n_gen, n_ctx, ctx = s.generation_requests, s.context_requests, s.ctx_tokens
        n = s.scheduled_requests if s.scheduled_requests is not None and s.scheduled_requests > 0 else n_gen + n_ctx
        tokens = n_gen + ctx
        attention, carry = self._attention(n_gen, n_ctx, ctx, carry, s.tokens_per_block or 32)
        return self._row(ph, s, k, n, n_gen, tokens, attention), carry

    def _attention(self, n_gen: int, n_ctx: int, ctx: int, carry: float, tpb: int) -> tuple[float, float]:
        """The causal attention work of an iteration's context chunks, (p + c)^2 - p^2 summed, and the prompt
        tokens carried into the next iteration. Chunks are served in admission order within the token budget
        (max_num_tokens less the generation tokens), so a prompt that did not fit continues first in the next
        iteration with p = what it computed so far; the last chunk of a budget-full iteration is such a prompt.
        An iteration with one context request shows its chunk; with several, only their sum T, whose squares add
        up to T^2 / n x the spread E[c^2] / E[c]^2 of the chunks, which the single-chunk iterations tell."""
        if not ctx or not n_ctx:
            return 0.0, 0.0
        full = ctx >= self.max_num_tokens - n_gen - tpb + 1
        if n_ctx == 1:
            self._chunks = [(1 - CHUNK_SMOOTHING) * m + CHUNK_SMOOTHING * x
                            for m, x in zip(self._chunks, (float(ctx), float(ctx) * ctx))]
            return (carry + ctx) ** 2 - carry * carry, carry + ctx if full else 0.0
        chunk = ctx / n_ctx
        return ctx * chunk * self._spread() + 2 * carry * chunk, chunk if full else 0.0

    def _spread(self) -> float:
        mean, square = self._chunks
        return min(MAX_CHUNK_SPREAD, max(1.0, square / (mean * mean))) if mean > 0 else 1.0

    def _rows_pytorch(self, good: list[tuple[IterationSample, float]], context: PromptWork | None) -> list[Row]:
        """PyTorch backend: no per-iteration counts. The active requests decode; an iteration clearly slower than
        the decode model (PREFILL_EXCESS residual scales above the window's median residual) also ran prompts. Its prompt tokens are
        what its latency implies under the fit as it stands (``_implied_tokens``), scaled so that they add up
        to the prompt tokens the pods computed (``context``, from the request counters, summed with the same
        half-life as the fit): a fit whose
        prefill rate is off implies too many or too few, the scaling corrects them, and the next solve moves
        the rate. Without ``context`` such iterations are left out (the prefill rate keeps its prior)."""
        theta = self._theta()
        decode = [self._row(self._phys(s.tokens_per_block), s, k, s.active_requests, s.active_requests,
                            float(s.active_requests), 0.0) for s, k in good]
        prompt = context.tokens / context.requests if context is not None and context.requests >= 1 \
            and math.isfinite(context.requests) and math.isfinite(context.tokens) else float(self.max_num_tokens)
        prompt = min(max(prompt, 1.0), float(self.max_num_tokens))
        # Against the window's own bulk (the iteration-weighted median residual), not the fit's level: a fit
        # still 20% off would read every iteration as a prefill.
        residuals = [r.latency_s / self._predict(r, theta) - 1.0 for r in decode]
        bulk = _weighted_median(residuals, [r.iterations for r in decode])
        implied = [self._implied_tokens(r, theta) if res > bulk + PREFILL_EXCESS * self._scale else 0.0
                   for r, res in zip(decode, residuals)]
        total = sum(r.iterations * c for r, c in zip(decode, implied))
        if context is None or not (context.tokens >= 0 and math.isfinite(context.tokens)) or total <= 0:
            return [r for r, c in zip(decode, implied) if not c]
        # Over the fit's memory, not one window: a long prompt spans windows, and the counters count prompts
        # when their request finishes.
        self._prompt_work = [self._prompt_work[0] + total, self._prompt_work[1] + context.tokens]
        implied_sum, counted = self._prompt_work
        scale = min(4.0, max(0.25, counted / implied_sum)) if implied_sum > 0 and counted > 0 else 1.0
        out = []
        for (s, k), row, c in zip(good, decode, implied):
            tokens = c * scale
            out.append(row if not c else self._row(self._phys(s.tokens_per_block), s, k, s.active_requests,
                                                   s.active_requests, s.active_requests + tokens,
                                                   tokens * min(tokens, prompt)))
        return out

    @staticmethod
    def _implied_tokens(row: Row, theta: Mapping[str, float]) -> float:
        """Prompt tokens that make a decode row's predicted latency its measured one, on the compute branch of
        the GEMMs (a prompt hidden under the weight stream leaves no trace: at least the tokens that reach it)."""
        rest = theta["k"] * row.kv + theta["c0"] + theta["c1"] * row.sequences + row.known_s
        gemm_per_token = row.gemm / max(1.0, row.sequences)  # G: the decode row's tokens are its sequences
        need = (row.latency_s - rest) / theta["l"]
        crossover = theta["w"] * row.weights / (theta["l"] * gemm_per_token) - row.sequences if gemm_per_token > 0 else 0.0
        tokens = need / gemm_per_token - row.sequences if gemm_per_token > 0 else 0.0
        return max(tokens, crossover, 1.0)

    def _row(self, ph: Physics, s: IterationSample, k: float, n: int, n_gen: int, tokens: float,
             attention: float) -> Row:
        tpb = s.tokens_per_block if s.tokens_per_block > 0 else 32
        # Blocks are whole: a sequence's last block is half empty on average. The pool is read once the
        # iteration's finished requests gave their blocks back, while they were read in it: each is counted
        # as an average one of those left. A sample standing for a run of k decode iterations reports the end
        # of the run, when every sequence had grown by k tokens, k + 1 halves of them past the run's mean.
        live = max(0, n - min(s.completed_requests, n))
        kv = max(0.0, s.used_blocks * tpb - live * tpb / 2)
        kv = kv * n / live if live else kv
        kv = max(0.0, kv - n_gen * (k + 1) / 2 if k > 1 else kv)
        return Row(ph.weights_s, ph.kv_s_per_token * kv, ph.linear_s_per_token * tokens,
                   ph.attn_s_per_token2 * attention, float(n),
                   ph.allreduce_fixed_s + ph.allreduce_s_per_token * tokens, s.iter_latency_ms / 1e3, k)

    # -- the model ---------------------------------------------------------------------------------------
    def _theta(self, u: Sequence[float] | None = None) -> dict[str, float]:
        values = dict(zip(self._names, u if u is not None else self._u))
        theta = {n: self._theta0[n] * values.get(n, 1.0) for n in self._theta0}
        if self.known:
            theta["w"] = theta["k"]
        return theta

    @staticmethod
    def _predict(row: Row, theta: Mapping[str, float]) -> float:
        return (max(theta["w"] * row.weights, theta["l"] * row.gemm) + theta["k"] * row.kv
                + theta["l"] * row.attention + theta["c0"] + theta["c1"] * row.sequences + row.known_s)

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
        predicted = sum(r.iterations * self._predict(r, theta) for r in rows) / n
        base = sum(r.iterations * self._predict(r, nominal) for r in rows) / n
        return WindowCheck(n, measured * 1e3, predicted * 1e3, base * 1e3, rejected, per_token)

    def _accumulate(self, rows: list[Row]) -> int:
        """Add the rows to the normal equations (relative residuals, Huber weights); returns those dropped."""
        theta = self._theta()
        dropped = 0
        predictions = [self._predict(row, theta) for row in rows]
        # Hostile means far from the window's other iterations, not from the fit: a template that starts 10x
        # off (another GPU) must still learn from every row.
        ratios = [(row.latency_s / p, row.iterations) for row, p in zip(rows, predictions)
                  if p > 0 and math.isfinite(row.latency_s / p)]
        bulk = _weighted_median([x for x, _ in ratios], [w for _, w in ratios]) if ratios else 1.0
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
                         pool_tokens=tuple(self._pools.items()), tokens_per_block=self._tpb,
                         iterations=self._weight, windows=self._windows, latency_error=self._error,
                         nominal_error=self._nominal_error, per_token=self._per_token)


def _sane(s: IterationSample) -> bool:
    """A sample the fit may use: finite, non-negative, bounded (the parser already bounds what pods send;
    this module is also fed by other code)."""
    counts = (s.used_blocks, s.max_blocks, s.tokens_per_block, s.active_requests, s.generation_requests,
              s.context_requests, s.ctx_tokens, s.iteration)
    try:  # the sum of whole numbers is whole: a float (NaN among them), a string or None among them is not
        if type(sum(counts)) is not int or min(counts) < 0:
            return False
    except TypeError:
        return False
    latency = s.iter_latency_ms
    return isinstance(latency, (int, float)) and math.isfinite(latency) and 0 <= latency <= MAX_LATENCY_MS


def _spaced(indices: list[int], most: int) -> list[int]:
    """At most ``most`` of ``indices``, evenly spaced."""
    if len(indices) <= most:
        return indices
    if most <= 0:
        return []
    step = len(indices) / most
    return [indices[int(j * step)] for j in range(most)]


def _thinned(good: list[tuple[IterationSample, float]], most: int) -> list[tuple[IterationSample, float]]:
    """At most ``most`` samples, evenly spaced, each weighing for those left out."""
    if len(good) <= most:
        return good
    kept = [good[i] for i in _spaced(list(range(len(good))), most)]
    scale = len(good) / len(kept)
    return [(s, k * scale) for s, k in kept]


def _weighted_median(values: list[float], weights: list[float]) -> float:
    if not values:
        return 0.0
    pairs = sorted(zip(values, weights))
    half, acc = sum(weights) / 2, 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= half:
            return value
    return pairs[-1][0]


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
