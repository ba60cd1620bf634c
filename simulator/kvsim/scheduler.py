"""The two scheduling stages of TensorRT-LLM's batch manager, as a mixin of ``Engine``.

Capacity stage (capacityScheduler.cpp):
- GUARANTEED_NO_EVICT: running requests keep the blocks they will need to completion; waiting requests are
  admitted in arrival order while prompt + max_tokens blocks (minus reusable prefix blocks) fit what is left;
  the first that does not fit stops admission (strict FIFO). Never pauses.
- MAX_UTILIZATION: blocks are taken as tokens arrive; when the next step does not fit, the most recently
  started request is paused (its blocks freed; later it is re-prefilled with prompt + tokens generated so far).
- STATIC_BATCH: GUARANTEED_NO_EVICT that admits only while no request is generating: request-level static
  batching, where a batch is whatever the first iteration's token budget admits.
Micro-batch stage (microBatchScheduler.cpp): generation requests first, then context requests in order under
max_num_tokens; without chunked context a context that does not fit the remaining budget stops the step; with
chunked context (FCFS) a context gets the largest chunk that fits, in multiples of tokens_per_block.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from .config import CapacityPolicy, KvCacheType

if TYPE_CHECKING:  # pragma: no cover
    from .engine import _Seq

QUEUED, ADMITTED, CONTEXT, GENERATION, DONE = range(5)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class SchedulingMixin:
    """Capacity admission, pausing and block bookkeeping; state lives on the Engine."""

    # -- block needs -------------------------------------------------------------------------------------
    def _blocks_for(self, seq: _Seq, tokens: int) -> int:
        if self._contiguous:
            return self._contiguous_blocks
        return ceil_div(tokens, self._tpb)

    def _reservation_blocks(self, seq: _Seq) -> int:
        """Blocks a request needs to run to completion (what GUARANTEED_NO_EVICT reserves)."""
        return self._blocks_for(seq, seq.prompt_tokens + seq.max_tokens)

    def _grow(self, seq: _Seq, blocks_needed: int) -> None:
        """Allocate blocks so ``seq`` holds ``blocks_needed`` (its reservation shrinks by as many)."""
        extra = blocks_needed - len(seq.blocks)
        if extra > 0:
            seq.blocks.extend(self.pool.allocate(extra))
            self._alloc_new += extra
            self._alloc_total += extra
            if seq.reserved:
                self._reserved -= extra

    def _charged_blocks(self, seq: _Seq) -> int:
        """Decode blocks counted for ``seq`` but not materialized (see blocks.BlockPool.charge)."""
        if seq.state != GENERATION or self._contiguous:
            return 0
        tokens = seq.prompt_tokens + seq.gen_base_count + self._G - seq.gen_base_G
        return max(0, ceil_div(tokens, self._tpb) - len(seq.blocks))

    def _release_all(self, seq: _Seq) -> None:
        charged = self._charged_blocks(seq)
        if seq.reserved:
            self._reserved -= seq.blocks_total - len(seq.blocks) - charged
            seq.reserved = False
        if seq.state == GENERATION and not self._contiguous:
            del self._buckets[seq.phase][seq.seq_no]
        self.pool.release(seq.blocks, seq.keyed)
        self.pool.uncharge(charged)
        seq.blocks = []
        seq.keyed = 0

    def check_invariants(self) -> None:
        """Raise AssertionError if the engine's bookkeeping is inconsistent (property tests call this)."""
        self.pool.check(s.blocks for s in self._active.values())
        charged = sum(self._charged_blocks(s) for s in self._gen.values())
        assert charged == self.pool.charged, f"charged blocks {self.pool.charged} != sum over sequences {charged}"
        running = list(self._ctx.values()) + list(self._gen.values())
        if self._policy is not CapacityPolicy.MAX_UTILIZATION:
            expected = sum(s.blocks_total - len(s.blocks) - self._charged_blocks(s) for s in running)
            assert self._reserved == expected, f"reserved {self._reserved} != outstanding reservations {expected}"
            assert self._reserved >= 0 and self.pool.free >= self._reserved, "reservations exceed the pool"
            assert self._paused_total == 0, "a request was paused under a no-evict policy"
        for s in self._gen.values():
            assert s.state == GENERATION and s.seq_no in self._active
        assert len(running) <= self.config.max_batch_size, "more requests running than max_batch_size"

    # -- capacity stage ----------------------------------------------------------------------------------
    def _admission_limit(self) -> int:
        """Requests that may hold a slot at once: the runtime batch size (tuner included), and never more
        generation requests than max_num_tokens can carry."""
        return min(self._runtime_batch_size(), self._runtime_max_num_tokens())

    def _capacity_step(self, token_budget: int) -> None:
        """Allocate the blocks the next iteration's decodes need, pause if MAX_UTILIZATION must, then admit."""
        policy = self._policy
        if policy is CapacityPolicy.MAX_UTILIZATION:
            self._make_room()
        self._charge_decode_growth(self._G + 1, self._G + 1)
        if not self._unadmitted:
            return
        if policy is CapacityPolicy.STATIC_BATCH and self._gen:
            return
        limit = self._admission_limit()
        budget = token_budget if policy is CapacityPolicy.STATIC_BATCH else None
        committed = self._ctx_step_need() if policy is CapacityPolicy.MAX_UTILIZATION else 0
        while self._unadmitted and len(self._ctx) + len(self._gen) < limit:
            seq = self._active[self._unadmitted[0]]
            if budget is not None:
                first_chunk = self._first_chunk(seq, budget)
                if first_chunk == 0:
                    break
            needed = self._try_admit(seq, committed)
            if needed is None:
                break
            heapq.heappop(self._unadmitted)
            committed += needed
            if budget is not None:
                budget -= first_chunk

    def _try_admit(self, seq: _Seq, committed: int) -> int | None:
        """Admit ``seq`` if its blocks fit; returns the blocks it committed this step, None if it does not fit."""
        tpb = self._tpb
        keys = seq.keys if not self._contiguous else ()
        usable_keys = keys[: max(0, (seq.ctx_target - 1) // tpb)]  # the last prompt token is always recomputed
        matched, matched_free = self.pool.peek_prefix(usable_keys)
        if self._policy is CapacityPolicy.MAX_UTILIZATION:
            total = self._blocks_for(seq, seq.ctx_target + 1)
            consume = total - matched + matched_free
            if consume > self.pool.free - committed:
                return None
            reserved = False
        else:
            total = self._reservation_blocks(seq)
            consume = total - matched + matched_free
            if consume > self.pool.free - self._reserved:
                return None
            reserved = True
        seq.blocks = self.pool.acquire_prefix(usable_keys[:matched])
        seq.keyed = len(seq.blocks)
        seq.ctx_done = len(seq.blocks) * tpb
        seq.blocks_total = total
        seq.reserved = reserved
        if reserved:
            self._reserved += total - len(seq.blocks)
        self._alloc_total += matched
        self._reused += matched
        self._missed += ceil_div(seq.prompt_tokens, tpb) - matched
        seq.reused_blocks += matched
        seq.state = ADMITTED
        self._ctx[seq.seq_no] = seq
        return 0 if reserved else total - matched

    def _ctx_step_need(self) -> int:
        """Blocks the admitted contexts still need (MAX_UTILIZATION counts them before new admissions)."""
        need = 0
        for seq in self._ctx.values():
            need += max(0, self._blocks_for(seq, seq.ctx_target + 1) - len(seq.blocks))
        return need

    def _make_room(self) -> None:
        """MAX_UTILIZATION: pause the most recently started requests until this step's blocks fit."""
        due = self._buckets[(self._G + 1) % self._tpb] if not self._contiguous else {}
        while len(due) + self._ctx_step_need() > self.pool.free:
            victim = self._last_started()
            if victim is None:
                break
            self._pause(victim)

    def _last_started(self) -> _Seq | None:
        heap = self._started_heap
        while heap:
            neg_no, version = heap[0]
            seq = self._active.get(-neg_no)
            if seq is not None and seq.version == version and seq.state in (CONTEXT, GENERATION):
                return seq
            heapq.heappop(heap)
        return None

    def _pause(self, seq: _Seq) -> None:
        """Free a started request's blocks and put it back in line; it will re-prefill prompt + generated."""
        if seq.state == GENERATION:
            generated = self._generated(seq)
            self._release_all(seq)
            self._leave_generation(seq, generated)
            seq.output_tokens = generated
        else:
            self._ctx.pop(seq.seq_no, None)
            self._release_all(seq)
        seq.version += 1
        seq.state = QUEUED
        seq.ctx_target = seq.prompt_tokens + seq.output_tokens
        seq.ctx_done = 0
        seq.num_pauses += 1
        self._paused_step += 1
        self._paused_total += 1
        heapq.heappush(self._unadmitted, seq.seq_no)

    # -- micro-batch stage -------------------------------------------------------------------------------
    def _first_chunk(self, seq: _Seq, budget: int) -> int:
        """The context tokens ``seq`` gets this step. A paused request's re-prefill (prompt + generated) may exceed
        max_num_tokens, so it is always chunked; otherwise it could never run again."""
        remaining = seq.ctx_target - seq.ctx_done
        if remaining <= budget:
            return remaining
        if not (self._chunked or seq.num_pauses):
            return 0
        return budget // self._tpb * self._tpb

    def _context_chunks(self, token_budget: int) -> list[tuple[_Seq, int]]:
        """Context work of this iteration, in admission order, under the token and batch budgets."""
        chunks: list[tuple[_Seq, int]] = []
        slots = self._runtime_batch_size() - len(self._gen)
        for seq in self._ctx.values():
            if slots <= 0 or token_budget <= 0:
                break
            chunk = self._first_chunk(seq, token_budget)
            if chunk <= 0:
                break
            chunks.append((seq, chunk))
            token_budget -= chunk
            slots -= 1
        return chunks

    # -- decode growth: a decoding sequence needs a new block every tpb iterations, at a fixed phase -------
    def _join_buckets(self, seq: _Seq) -> None:
        """File a sequence that starts decoding under the phase (iteration mod tpb) of its block crossings."""
        if self._contiguous:
            return
        tokens = seq.prompt_tokens + seq.gen_base_count
        first_cross = seq.gen_base_G + len(seq.blocks) * self._tpb + 1 - tokens
        seq.phase = first_cross % self._tpb
        self._buckets[seq.phase][seq.seq_no] = seq

    def _charge_decode_growth(self, first_G: int, last_G: int) -> None:
        """Charge the blocks decoding sequences grow into during iterations first_G..last_G."""
        if self._contiguous or last_G < first_G:
            return
        tpb, buckets = self._tpb, self._buckets
        k = last_G - first_G + 1
        full, rest = divmod(k, tpb)
        total = 0
        if full:
            total = full * len(self._gen)
        for offset in range(rest):
            total += len(buckets[(first_G + offset) % tpb])
        if total:
            self.pool.charge(total)
            if self._policy is not CapacityPolicy.MAX_UTILIZATION:
                self._reserved -= total

    @property
    def _contiguous(self) -> bool:
        return self._kv_type is KvCacheType.CONTINUOUS
