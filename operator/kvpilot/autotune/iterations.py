"""One iteration's stats as the engine fit reads them (autotune/calibrate.py): the physics terms of kvsim's
iteration time, derived from what a pod reports, robust to what a hostile or odd pod sends, bounded in memory.

``IterationReader`` keeps what reading needs across windows, per engine: each pod's last ``iter`` (the step a
sample stands for; a counter that goes back is a restarted pod), the prompt a pod was computing in chunks when
its last iteration was budget-full, the spread of single context chunks, the pool each runtime limit showed, and
(PyTorch stats) the prompt tokens the latencies implied against those the counters saw. See calibrate.py for
the model these rows feed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kvsim import Calibration, Profile
from kvsim.latency import IterationModel

MAX_STEP_WEIGHT = 64  # a sample stands for at most this many iterations (its ``iter`` step), whatever it claims
MAX_LATENCY_MS = 1e6
MAX_PODS = 64
MAX_POOLS = 8
MAX_ROWS_PER_WINDOW = 96  # per pod: the fit's CPU is bounded whatever the pod reports (about 1 ms a window)
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
    def max_batch_size_static(self) -> int: ...
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


def predict(row: Row, theta: Mapping[str, float]) -> float:
    """kvsim's iteration time of ``row`` at the fitted values ``theta`` (seconds per unit term)."""
    return (max(theta["w"] * row.weights, theta["l"] * row.gemm) + theta["k"] * row.kv
            + theta["l"] * row.attention + theta["c0"] + theta["c1"] * row.sequences + row.known_s)


class IterationReader:
    """Reads one engine's pods' iteration stats into rows (see the module docstring for what it keeps)."""

    def __init__(self, profile: Profile, max_num_tokens: int = 8192) -> None:
        self.profile = profile
        self.max_num_tokens = max(1, max_num_tokens)
        self._physics: dict[int, Physics] = {}
        self._last_iter: OrderedDict[str, int] = OrderedDict()
        self._carry: OrderedDict[str, float] = OrderedDict()  # per pod: prompt tokens a chunked prompt computed
        self._pools: OrderedDict[int, int] = OrderedDict()
        self.tokens_per_block = 0
        self._chunks = [0.0, 0.0]  # running mean of single context chunks and of their squares
        self._prompt_work = [0.0, 0.0]  # PyTorch: prompt tokens the latencies implied, and those the counters saw
        self._theta: Mapping[str, float] = {}
        self._fit_scale = 0.05

    @property
    def pools(self) -> tuple[tuple[int, int], ...]:
        """(runtime max_batch_size, KV tokens in one pod's pool), newest last."""
        return tuple(self._pools.items())

    def decay(self, factor: float) -> None:
        self._prompt_work = [v * factor for v in self._prompt_work]

    def rows(self, pod: str, samples: Sequence[IterationSample], limit: int, context: PromptWork | None,
             theta: Mapping[str, float], scale: float) -> tuple[list[Row], int, bool]:
        """The pod's samples as rows; also how many were unusable and whether they carried token counts.
        ``theta`` and ``scale``: the fit as it stands and its residual scale (the PyTorch path reads its prompt
        iterations against them)."""
        self._theta, self._fit_scale = theta, scale
        good: list[tuple[IterationSample, float]] = []
        bad = 0
        prev = self._last_iter.pop(pod, None)
        last: dict[int, IterationSample] = {}  # the latest sample at each configured limit: the pool it reports
        for s in samples:
            if not _sane(s):
                bad += 1
                continue
            step = s.iteration - prev if prev is not None and s.iteration > prev else 1
            prev = s.iteration
            last[s.max_batch_size_static] = s
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
        # The pool is carved at load for the configured limit (maxBatchSizeStatic, the executor's mMaxBatchSize);
        # maxBatchSizeRuntime is the in-engine tuner's value of the moment (TrtGptModelInflightBatching::
        # setRuntimeBatchSize, cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp; see
        # shared/reference/trtllm.md), so a pool labelled by it would size the model's memory for a limit the
        # pool was not carved for. The PyTorch backend reports both as 0: the limit rendered stands in.
        at = s.max_batch_size_static or limit
        if s.max_blocks > 0 and s.tokens_per_block > 0 and at > 0:
            self._pools.pop(at, None)
            self._pools[at] = s.max_blocks * s.tokens_per_block
            while len(self._pools) > MAX_POOLS:
                self._pools.popitem(last=False)
            self.tokens_per_block = s.tokens_per_block

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
        theta = self._theta
        decode = [self._row(self._phys(s.tokens_per_block), s, k, s.active_requests, s.active_requests,
                            float(s.active_requests), 0.0) for s, k in good]
        prompt = context.tokens / context.requests if context is not None and context.requests >= 1 \
            and math.isfinite(context.requests) and math.isfinite(context.tokens) else float(self.max_num_tokens)
        prompt = min(max(prompt, 1.0), float(self.max_num_tokens))
        # Against the window's own bulk (the iteration-weighted median residual), not the fit's level: a fit
        # still 20% off would read every iteration as a prefill.
        residuals = [r.latency_s / predict(r, theta) - 1.0 for r in decode]
        bulk = weighted_median(residuals, [r.iterations for r in decode])
        implied = [self._implied_tokens(r, theta) if res > bulk + PREFILL_EXCESS * self._fit_scale else 0.0
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


def weighted_median(values: list[float], weights: list[float]) -> float:
    if not values:
        return 0.0
    pairs = sorted(zip(values, weights))
    half, acc = sum(weights) / 2, 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= half:
            return value
    return pairs[-1][0]
