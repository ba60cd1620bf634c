"""The two scheduling stages of TensorRT-LLM's batch manager, over the batch state the engine owns.

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

``Scheduler`` is a slotted dataclass: every piece of state the scheduling stages read or write is a declared,
typed field (the type checker sees a typo or a missing field), and the ``Engine`` owns one and drives it. It
is one object rather than state + functions because this is the simulator's hot path: its methods reach their
state in one attribute load.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .blocks import BlockPool
from .config import CapacityPolicy
from .sequence import ADMITTED, CONTEXT, GENERATION, QUEUED, Seq, ceil_div


@dataclass(slots=True, eq=False)
class Scheduler:
    """Capacity admission, pausing and block bookkeeping of the requests in the batch.

    The engine's loop moves requests in (``active``, ``unadmitted``) and out (``leave_generation``), advances the
    decode-iteration counter ``G`` and the KV tokens of decoding sequences ``gen_kv``, and keeps the runtime
    limits ``batch_size`` / ``max_num_tokens`` current (the in-engine tuner changes them).
    """

    pool: BlockPool
    tpb: int  # tokens per block
    policy: CapacityPolicy
    chunked: bool  # enable_chunked_context
    contiguous: bool  # kv_cache_type continuous: max_seq_len reserved per request
    contiguous_blocks: int  # blocks of one max_seq_len request (continuous KV cache)
    max_batch_size: int  # the configured runtime limit (the invariant checks hold it)
    batch_size: int  # the runtime batch size now (the tuner's, when on, capped by max_batch_size)
    max_num_tokens: int  # the runtime token budget now (likewise)
    active: dict[int, Seq] = field(default_factory=dict)  # fetched into the batch, by seq_no, in fetch order
    unadmitted: list[int] = field(default_factory=list)  # heap of seq_nos fetched or paused, waiting for blocks
    ctx: dict[int, Seq] = field(default_factory=dict)  # admitted, prefilling, in admission order
    gen: dict[int, Seq] = field(default_factory=dict)  # decoding
    buckets: list[dict[int, Seq]] = field(default_factory=list)  # decoding sequences by block-crossing phase
    started_heap: list[tuple[int, int]] = field(default_factory=list)  # (-seq_no, version): last started first
    G: int = 0  # decode iterations run so far (the global counter every decoding sequence advances with)
    gen_kv: int = 0  # KV tokens held by decoding sequences
    reserved: int = 0  # blocks promised to running requests but not yet allocated (no-evict policies)
    # Counters for the iteration stats (kvCacheStats): blocks allocated in all, newly, reused and missed.
    alloc_total: int = 0
    alloc_new: int = 0
    reused: int = 0
    missed: int = 0
    paused_step: int = 0  # requests paused since the last stats sample
    paused_total: int = 0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [{} for _ in range(self.tpb)]

    def generated(self, seq: Seq) -> int:
        """Tokens ``seq`` has generated so far (a decoding sequence's count follows the counter G)."""
        if seq.state == GENERATION:
            return seq.gen_base_count + self.G - seq.gen_base_G
        return seq.output_tokens

    def leave_generation(self, seq: Seq, generated: int) -> None:
        del self.gen[seq.seq_no]
        self.gen_kv -= seq.prompt_tokens + generated

    # -- block needs -------------------------------------------------------------------------------------
    def blocks_for(self, seq: Seq, tokens: int) -> int:
        if self.contiguous:
            return self.contiguous_blocks
        return ceil_div(tokens, self.tpb)

    def _reservation_blocks(self, seq: Seq) -> int:
        """Blocks a request needs to run to completion (what GUARANTEED_NO_EVICT reserves)."""
        return self.blocks_for(seq, seq.prompt_tokens + seq.max_tokens)

    def grow(self, seq: Seq, blocks_needed: int) -> None:
        """Allocate blocks so ``seq`` holds ``blocks_needed`` (its reservation shrinks by as many)."""
        extra = blocks_needed - len(seq.blocks)
        if extra > 0:
            seq.blocks.extend(self.pool.allocate(extra))
            self.alloc_new += extra
            self.alloc_total += extra
            if seq.reserved:
                self.reserved -= extra

    def _charged_blocks(self, seq: Seq) -> int:
        """Decode blocks counted for ``seq`` but not materialized (see blocks.BlockPool.charge)."""
        if seq.state != GENERATION or self.contiguous:
            return 0
        tokens = seq.prompt_tokens + seq.gen_base_count + self.G - seq.gen_base_G
        return max(0, ceil_div(tokens, self.tpb) - len(seq.blocks))

    def release_all(self, seq: Seq) -> None:
        charged = self._charged_blocks(seq)
        if seq.reserved:
            self.reserved -= seq.blocks_total - len(seq.blocks) - charged
            seq.reserved = False
        if seq.state == GENERATION and not self.contiguous:
            del self.buckets[seq.phase][seq.seq_no]
        self.pool.release(seq.blocks, seq.keyed)
        self.pool.uncharge(charged)
        seq.blocks = []
        seq.keyed = 0

    def check_invariants(self) -> None:
        """Raise AssertionError if the engine's bookkeeping is inconsistent (property tests call this)."""
        self.pool.check(s.blocks for s in self.active.values())
        charged = sum(self._charged_blocks(s) for s in self.gen.values())
        assert charged == self.pool.charged, f"charged blocks {self.pool.charged} != sum over sequences {charged}"
        running = list(self.ctx.values()) + list(self.gen.values())
        if self.policy is not CapacityPolicy.MAX_UTILIZATION:
            expected = sum(s.blocks_total - len(s.blocks) - self._charged_blocks(s) for s in running)
            assert self.reserved == expected, f"reserved {self.reserved} != outstanding reservations {expected}"
            assert self.reserved >= 0 and self.pool.free >= self.reserved, "reservations exceed the pool"
            assert self.paused_total == 0, "a request was paused under a no-evict policy"
        for s in self.gen.values():
            assert s.state == GENERATION and s.seq_no in self.active
        assert len(running) <= self.max_batch_size, "more requests running than max_batch_size"

    # -- capacity stage ----------------------------------------------------------------------------------
    def _admission_limit(self) -> int:
        """Requests that may hold a slot at once: the runtime batch size (tuner included), and never more
        generation requests than max_num_tokens can carry."""
        return min(self.batch_size, self.max_num_tokens)

    def capacity_step(self, token_budget: int) -> None:
        """Allocate the blocks the next iteration's decodes need, pause if MAX_UTILIZATION must, then admit."""
        policy = self.policy
        if policy is CapacityPolicy.MAX_UTILIZATION:
            self._make_room()
        self.charge_decode_growth(self.G + 1, self.G + 1)
        if not self.unadmitted:
            return
        if policy is CapacityPolicy.STATIC_BATCH and self.gen:
            return
        limit = self._admission_limit()
        budget = token_budget if policy is CapacityPolicy.STATIC_BATCH else None
        committed = self._ctx_step_need() if policy is CapacityPolicy.MAX_UTILIZATION else 0
        while self.unadmitted and len(self.ctx) + len(self.gen) < limit:
            seq = self.active[self.unadmitted[0]]
            if budget is not None:
                first_chunk = self._first_chunk(seq, budget)
                if first_chunk == 0:
                    break
            needed = self._try_admit(seq, committed)
            if needed is None:
                break
            heapq.heappop(self.unadmitted)
            committed += needed
            if budget is not None:
                budget -= first_chunk

    def _try_admit(self, seq: Seq, committed: int) -> int | None:
        """Admit ``seq`` if its blocks fit; returns the blocks it committed this step, None if it does not fit."""
        tpb = self.tpb
        keys = seq.keys if not self.contiguous else ()
        usable_keys = keys[: max(0, (seq.ctx_target - 1) // tpb)]  # the last prompt token is always recomputed
        matched, matched_free = self.pool.peek_prefix(usable_keys)
        if self.policy is CapacityPolicy.MAX_UTILIZATION:
            total = self.blocks_for(seq, seq.ctx_target + 1)
            consume = total - matched + matched_free
            if consume > self.pool.free - committed:
                return None
            reserved = False
        else:
            total = self._reservation_blocks(seq)
            consume = total - matched + matched_free
            if consume > self.pool.free - self.reserved:
                return None
            reserved = True
        seq.blocks = self.pool.acquire_prefix(usable_keys[:matched])
        seq.keyed = len(seq.blocks)
        seq.ctx_done = len(seq.blocks) * tpb
        seq.blocks_total = total
        seq.reserved = reserved
        if reserved:
            self.reserved += total - len(seq.blocks)
        self.alloc_total += matched
        self.reused += matched
        self.missed += ceil_div(seq.prompt_tokens, tpb) - matched
        seq.reused_blocks += matched
        seq.state = ADMITTED
        self.ctx[seq.seq_no] = seq
        return 0 if reserved else total - matched

    def _ctx_step_need(self) -> int:
        """Blocks the admitted contexts still need (MAX_UTILIZATION counts them before new admissions)."""
        need = 0
        for seq in self.ctx.values():
            need += max(0, self.blocks_for(seq, seq.ctx_target + 1) - len(seq.blocks))
        return need

    def _make_room(self) -> None:
        """MAX_UTILIZATION: pause the most recently started requests until this step's blocks fit."""
        due = self.buckets[(self.G + 1) % self.tpb] if not self.contiguous else {}
        while len(due) + self._ctx_step_need() > self.pool.free:
            victim = self._last_started()
            if victim is None:
                break
            self._pause(victim)

    def _last_started(self) -> Seq | None:
        heap = self.started_heap
        while heap:
            neg_no, version = heap[0]
            seq = self.active.get(-neg_no)
            if seq is not None and seq.version == version and seq.state in (CONTEXT, GENERATION):
                return seq
            heapq.heappop(heap)
        return None

    def _pause(self, seq: Seq) -> None:
        """Free a started request's blocks and put it back in line; it will re-prefill prompt + generated."""
        if seq.state == GENERATION:
            generated = self.generated(seq)
            self.release_all(seq)
            self.leave_generation(seq, generated)
            seq.output_tokens = generated
        else:
            self.ctx.pop(seq.seq_no, None)
            self.release_all(seq)
        seq.version += 1
        seq.state = QUEUED
        seq.ctx_target = seq.prompt_tokens + seq.output_tokens
        seq.ctx_done = 0
        seq.num_pauses += 1
        self.paused_step += 1
        self.paused_total += 1
        heapq.heappush(self.unadmitted, seq.seq_no)

    # -- micro-batch stage -------------------------------------------------------------------------------
    def _first_chunk(self, seq: Seq, budget: int) -> int:
        """The context tokens ``seq`` gets this step. A paused request's re-prefill (prompt + generated) may exceed
        max_num_tokens, so it is always chunked; otherwise it could never run again."""
        remaining = seq.ctx_target - seq.ctx_done
        if remaining <= budget:
            return remaining
        if not (self.chunked or seq.num_pauses):
            return 0
        return budget // self.tpb * self.tpb

    def context_chunks(self, token_budget: int) -> list[tuple[Seq, int]]:
        """Context work of this iteration, in admission order, under the token and batch budgets."""
        chunks: list[tuple[Seq, int]] = []
        slots = self.batch_size - len(self.gen)
        for seq in self.ctx.values():
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
    def join_buckets(self, seq: Seq) -> None:
        """File a sequence that starts decoding under the phase (iteration mod tpb) of its block crossings."""
        if self.contiguous:
            return
        tokens = seq.prompt_tokens + seq.gen_base_count
        first_cross = seq.gen_base_G + len(seq.blocks) * self.tpb + 1 - tokens
        seq.phase = first_cross % self.tpb
        self.buckets[seq.phase][seq.seq_no] = seq

    def charge_decode_growth(self, first_G: int, last_G: int) -> None:
        """Charge the blocks decoding sequences grow into during iterations first_G..last_G."""
        if self.contiguous or last_G < first_G:
            return
        tpb, buckets = self.tpb, self.buckets
        k = last_G - first_G + 1
        full, rest = divmod(k, tpb)
        total = 0
        if full:
            total = full * len(self.gen)
        for offset in range(rest):
            total += len(buckets[(first_G + offset) % tpb])
        if total:
            self.pool.charge(total)
            if self.policy is not CapacityPolicy.MAX_UTILIZATION:
                self.reserved -= total
