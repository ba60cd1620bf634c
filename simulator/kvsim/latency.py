"""Time of one engine iteration, from physics plus the four calibrated numbers.

    t_iter = max(W / (eta * BW), 2 * P * n_tokens / (MFU * peak))   the GEMMs: weight streaming or compute
           + sum(ctx_i) * kv_B * f_block / (eta * BW)                 attention reads every sequence's KV
           + 2 * L * d * sum((p+c)^2 - p^2) / (MFU * peak)            causal attention of context chunks
           + c0 + c1 * n_scheduled                                    fixed and per-sequence overheads
           + all-reduce (TP > 1)

n_tokens counts every token of the iteration (one per decoding sequence plus the context chunks). This is
simulator-calibration.md section 4.4's form with its GEMM term made a roofline: section 4.4 charges decode
GEMMs as pure weight streaming, which holds up to a few hundred sequences but not at the ~4000 sequences of
the 128/128 row, where 2 * P FLOPs per token dominate. Context work adds to decode work (serialized), as in
section 4.4. ``f_block`` = 1 + overhead/bytes-per-block-chunk makes small KV blocks slower (the per-block cost
of the block-size trade-off). With PP the stages run one after the other, so time uses TP sharding only.

PyTorch backend (``graphs``, see ``cuda_graphs``): a generation-only iteration whose batch has a captured CUDA
graph costs the calibrated time (at the padded size when padding is on); one without pays the stated eager
overhead on top. Iterations that carry context are charged as on the TensorRT path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cuda_graphs import GraphPlan
from .profiles import ALLREDUCE_LATENCY_S, KV_BLOCK_OVERHEAD_BYTES, Profile


@dataclass(frozen=True)
class IterationModel:
    """Pre-computed per-iteration coefficients for one profile and block size (seconds)."""

    weights_s: float
    step_s: float
    per_seq_s: float
    kv_s_per_token: float  # reading one context token's KV in a decode step
    linear_s_per_token: float  # GEMM work of one context token
    attn_s_per_token2: float  # causal attention work per unit of (p+c)^2 - p^2
    allreduce_fixed_s: float
    allreduce_s_per_token: float
    graphs: GraphPlan | None = None  # PyTorch backend's CUDA graphs; None: the TensorRT path

    @classmethod
    def for_profile(cls, profile: Profile, tokens_per_block: int, graphs: GraphPlan | None = None) -> IterationModel:
        cal, m, tp = profile.calibration, profile.model, profile.tp
        bandwidth = cal.hbm_efficiency * profile.gpu.hbm_bytes_per_s
        weights_read = (m.layer_params * profile.weight_bytes_per_elem + m.embedding_params * 2.0) / tp
        chunk_bytes = tokens_per_block * m.head_dim * profile.kv_bytes_per_elem
        block_factor = 1.0 + KV_BLOCK_OVERHEAD_BYTES / chunk_bytes
        kv_per_token = 2 * m.num_layers * profile.kv_heads_per_gpu * m.head_dim * profile.kv_bytes_per_elem
        flops = cal.prefill_mfu * profile.tensor_flops
        if tp > 1:
            n_allreduce = 2 * m.num_layers
            link = profile.gpu.nvlink_bytes_per_s / 2  # one direction
            ring_bytes_per_token = 2 * (tp - 1) / tp * m.hidden_size * 2.0
            allreduce_fixed = n_allreduce * ALLREDUCE_LATENCY_S
            allreduce_per_token = n_allreduce * ring_bytes_per_token / link
        else:
            allreduce_fixed = allreduce_per_token = 0.0
        return cls(
            weights_s=weights_read / bandwidth,
            step_s=cal.step_overhead_s,
            per_seq_s=cal.per_sequence_s,
            kv_s_per_token=kv_per_token * block_factor / bandwidth,
            linear_s_per_token=2.0 * m.layer_params / tp / flops,
            attn_s_per_token2=2.0 * m.num_layers * m.hidden_size / tp / flops,
            allreduce_fixed_s=allreduce_fixed,
            allreduce_s_per_token=allreduce_per_token,
            graphs=graphs,
        )

    def gemm_s(self, n_tokens: int) -> float:
        """Linear layers of an iteration carrying ``n_tokens`` tokens: bandwidth- or compute-bound."""
        compute = self.linear_s_per_token * n_tokens
        return max(compute, self.weights_s)

    def decode_constant_s(self, n_gen: int) -> float:
        """The part of a pure-decode iteration that does not depend on context lengths (with CUDA graphs: at
        the padded size, or plus the eager overhead when no graph fits)."""
        graphs = self.graphs
        if graphs is None:
            return self.constant_s(n_gen)
        size = graphs.graph_size(n_gen)
        return self.constant_s(n_gen) + graphs.eager_step_s if size is None else self.constant_s(size)

    def constant_s(self, n_gen: int) -> float:
        """``decode_constant_s`` as the calibrated engine runs it (no graph question asked)."""
        return (
            self.gemm_s(n_gen)
            + self.step_s
            + self.per_seq_s * n_gen
            + self.allreduce_fixed_s
            + self.allreduce_s_per_token * n_gen
        )

    def iteration_s(self, n_gen: int, gen_kv_tokens: int, chunks: list[tuple[int, int]]) -> float:
        """One iteration: ``n_gen`` decoding sequences holding ``gen_kv_tokens`` tokens of KV in total, plus
        context ``chunks`` given as (chunk_tokens, tokens_already_in_kv)."""
        t = (self.constant_s(n_gen) if chunks else self.decode_constant_s(n_gen)) + self.kv_s_per_token * gen_kv_tokens
        if chunks:
            ctx_tokens = 0
            attn = 0
            prior_kv = 0
            for c, p in chunks:
                ctx_tokens += c
                attn += (p + c) * (p + c) - p * p
                prior_kv += p
            t += (
                self.gemm_s(n_gen + ctx_tokens) - self.gemm_s(n_gen)
                + self.per_seq_s * len(chunks)
                + self.attn_s_per_token2 * attn
                + self.kv_s_per_token * prior_kv
                + self.allreduce_s_per_token * ctx_tokens
            )
        return t

    def decode_run_s(self, n_gen: int, kv_tokens0: int, k: int) -> float:
        """Total time of ``k`` identical decode iterations; KV grows by ``n_gen`` tokens per iteration."""
        a = self.decode_constant_s(n_gen)
        return k * a + self.kv_s_per_token * (k * kv_tokens0 + n_gen * k * (k - 1) / 2)

    def decode_iterations_within(self, n_gen: int, kv_tokens0: int, budget_s: float) -> int:
        """Smallest k >= 1 whose run of k decode iterations lasts at least ``budget_s``: iterations that start
        before the budget ends all run with the current batch."""
        if budget_s <= 0:
            return 1
        a = self.decode_constant_s(n_gen)
        beta = self.kv_s_per_token
        q2 = beta * n_gen / 2.0
        q1 = a + beta * kv_tokens0 - q2
        if q2 <= 0:
            k = math.ceil(budget_s / q1)
        else:
            k = math.ceil((-q1 + math.sqrt(q1 * q1 + 4 * q2 * budget_s)) / (2 * q2))
        k = max(1, k)
        while k > 1 and self.decode_run_s(n_gen, kv_tokens0, k - 1) >= budget_s:
            k -= 1
        while self.decode_run_s(n_gen, kv_tokens0, k) < budget_s:
            k += 1
        return k
