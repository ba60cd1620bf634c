"""The simulated TensorRT-LLM engine: in-flight batching over a paged KV cache, iteration by iteration.

Speed: between arrivals, completions and context chunks, a batch of decoding sequences repeats the same
iteration with every context one token longer. ``Engine`` collapses such a run into one step: the run's time is
a closed-form arithmetic series (``IterationModel.decode_run_s``), completions come from a heap keyed by the
global decode-iteration counter, and the blocks sequences grow into are counted per phase (a sequence needs a
new block every tokens_per_block iterations, at a fixed phase), so a run costs O(tokens_per_block). Per-request work is therefore
O(log n) per event and O(1) per block, independent of how many iterations it lives.

A run ends at the next completion, at the next arrival that could be admitted, at the ``advance_to`` target,
and (MAX_UTILIZATION) before the pool could run short; that iteration then goes through the full scheduler.
One iteration-stats sample is emitted per step (see ``stats``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from .blocks import BlockPool
from .config import CapacityPolicy, EngineConfig, KvCacheType
from .latency import IterationModel
from .memory import plan_memory
from .request import Request, RequestRecord, RequestRejected
from .scheduler import ADMITTED, CONTEXT, DONE, GENERATION, QUEUED, SchedulingMixin, ceil_div
from .stats import StepSample, TimelinePoint, sample_to_json
from .tuner import max_capacity_batch_size, runtime_batch_size, runtime_max_num_tokens


@dataclass(slots=True, eq=False)
class _Seq(RequestRecord):
    """A request inside the engine: its public record plus scheduling state."""

    seq_no: int = 0
    keys: tuple = ()
    state: int = QUEUED
    ctx_target: int = 0
    ctx_done: int = 0
    blocks: list = field(default_factory=list)
    blocks_total: int = 0
    keyed: int = 0
    phase: int = 0
    reserved: bool = False
    gen_base_G: int = 0
    gen_base_count: int = 0
    fin_G: int = 0
    version: int = 0


class Engine(SchedulingMixin):
    """Drive with ``submit`` and ``advance_to``; read ``drain_iteration_stats`` and ``finished_requests``."""

    def __init__(self, config: EngineConfig, *, epoch_s: float | None = None, time_scale: float = 1.0,
                 timeline_interval_s: float | None = None, keep_finished: int | None = None) -> None:
        """``epoch_s``: wall-clock time of simulated t=0 (for timestamps); ``time_scale``: simulated seconds per
        wall second (trtllm-serve's KVSIM_SPEEDUP), so a timestamp is epoch + t / time_scale.
        ``keep_finished``: how many finished-request records to keep (None: all, for offline runs that read
        them at the end; a long-running server passes a bound, since it hands each record to its client)."""
        cfg = config.resolved()
        self.config = cfg
        self.profile = cfg.profile
        self.memory = plan_memory(self.profile, cfg.build_max_batch_size, cfg.build_max_num_tokens,
                                  cfg.tokens_per_block, cfg.free_gpu_memory_fraction, cfg.kv_max_tokens,
                                  runtime_max_batch_size=cfg.max_batch_size, max_seq_len=cfg.max_seq_len)
        self.model = IterationModel.for_profile(self.profile, cfg.tokens_per_block)
        self._kv_type = cfg.kv_cache_type
        self.pool = BlockPool(self.memory.num_blocks, cfg.enable_block_reuse and cfg.kv_cache_type is KvCacheType.PAGED)
        self._tpb = cfg.tokens_per_block
        self._policy = cfg.capacity_policy
        self._chunked = cfg.enable_chunked_context
        self._contiguous_blocks = ceil_div(cfg.max_seq_len, cfg.tokens_per_block)
        self._max_active = cfg.max_batch_size * self.profile.pp
        self.epoch_s = time.time() if epoch_s is None else epoch_s
        self.time_scale = time_scale
        self.last_sample: StepSample | None = None
        self.now = 0.0
        self.iteration = 0
        self._G = 0
        self._seq_numbers = itertools.count()
        self._pending: list[tuple[float, int, _Seq]] = []
        self._waiting: deque[_Seq] = deque()
        self._active: dict[int, _Seq] = {}
        self._unadmitted: list[int] = []
        self._ctx: dict[int, _Seq] = {}
        self._gen: dict[int, _Seq] = {}
        self._fin_heap: list[tuple[int, int, int]] = []
        self._buckets: list[dict[int, _Seq]] = [{} for _ in range(cfg.tokens_per_block)]
        self._started_heap: list[tuple[int, int]] = []
        self._gen_kv = 0
        self._reserved = 0
        self._alloc_total = self._alloc_new = self._reused = self._missed = 0
        self._completed_step = self._paused_step = 0
        self._completed_total = self._paused_total = 0
        self._finished: deque[_Seq] = deque(maxlen=keep_finished)
        self._stats: deque[StepSample] = deque(maxlen=cfg.iter_stats_max_iterations)
        self._tuning = cfg.enable_batch_size_tuning or cfg.enable_max_num_tokens_tuning
        self._tuner_bs = 0
        self._tuner_nt = 0
        self._tuner_dirty = True
        self.timeline: list[TimelinePoint] = []
        self._timeline_interval = timeline_interval_s
        self._next_sample_s = 0.0

    # -- public API --------------------------------------------------------------------------------------
    def submit(self, request: Request, now_s: float | None = None) -> RequestRecord:
        """Queue ``request`` arriving at ``now_s`` (default ``request.arrival_s``); returns its live record.
        Raises RequestRejected with TensorRT-LLM's reason when the engine could never serve it."""
        arrival = request.arrival_s if now_s is None else now_s
        max_tokens = request.max_tokens if request.max_tokens is not None else request.output_tokens
        self._validate(request.prompt_tokens, max_tokens)
        seq_no = next(self._seq_numbers)
        seq = _Seq(request_id=request.request_id if request.request_id is not None else seq_no,
                   arrival_s=arrival, prompt_tokens=request.prompt_tokens, max_tokens=max_tokens,
                   target_output_tokens=max(1, min(request.output_tokens, max_tokens)), seq_no=seq_no,
                   keys=tuple(request.block_keys(self._tpb)) if self.pool.enable_reuse else (),
                   ctx_target=request.prompt_tokens)
        if arrival <= self.now:
            self._waiting.append(seq)  # already arrived: queued at once, so counts() sees it immediately
        else:
            heapq.heappush(self._pending, (arrival, seq_no, seq))
        return seq

    def advance_to(self, t_s: float) -> None:
        """Run every iteration that starts before simulated time ``t_s`` (``math.inf``: until idle)."""
        while True:
            self._arrive(self.now)
            if self.now >= t_s:
                return
            if not self._active and not self._waiting:
                if not self._pending:
                    if t_s != math.inf:
                        self.now = t_s
                    return
                self.now = max(self.now, min(self._pending[0][0], t_s))
                continue
            if not self._round(t_s):
                if not self._pending:
                    raise RuntimeError("kvsim engine stalled: requests are queued but nothing can run")
                self.now = max(self.now, min(self._pending[0][0], t_s))

    def run_until_idle(self) -> None:
        self.advance_to(math.inf)

    def drain_iteration_stats(self) -> list[dict]:
        """The iteration-stats objects gathered since the last call (``GET /metrics`` semantics)."""
        out = [sample_to_json(s, self.epoch_s, self.time_scale) for s in self._stats]
        self._stats.clear()
        return out

    def finished_requests(self) -> list[RequestRecord]:
        """Records of every request that finished so far, in finishing order."""
        return list(self._finished)

    def pop_finished(self) -> list[RequestRecord]:
        out = list(self._finished)
        self._finished.clear()
        return out

    def abort(self, record: RequestRecord) -> bool:
        """Cancel the request behind ``record`` (its client went away), as trtllm-serve aborts the request's
        promise: it leaves the queue or the batch at once and its blocks go back to the pool (full prompt
        blocks stay cached for reuse, as on completion). The record gets ``error="cancelled"`` and a finish
        time; it is not counted as completed. False when the request had already finished."""
        seq = record
        if not isinstance(seq, _Seq) or seq.state == DONE:
            return False
        if seq.seq_no in self._active:
            if seq.state == QUEUED:  # fetched, waiting for capacity (or paused)
                self._unadmitted.remove(seq.seq_no)
                heapq.heapify(self._unadmitted)
            elif seq.state in (ADMITTED, CONTEXT):
                del self._ctx[seq.seq_no]
            generated = self._generated(seq)
            self._release_all(seq)
            if seq.state == GENERATION:
                self._leave_generation(seq, generated)
            seq.output_tokens = generated
            del self._active[seq.seq_no]
            self._tuner_dirty = True
        else:
            try:
                self._waiting.remove(seq)
            except ValueError:
                self._pending = [p for p in self._pending if p[2] is not seq]
                heapq.heapify(self._pending)
        seq.state = DONE
        seq.version += 1  # stale heap entries (finish, started) are skipped by version
        seq.finish_s = self.now
        seq.error = "cancelled"
        return True

    def progress(self, record: RequestRecord) -> int:
        """Tokens generated so far by the request behind ``record`` (for streaming)."""
        return self._generated(record) if isinstance(record, _Seq) else record.output_tokens

    @property
    def idle(self) -> bool:
        return not (self._active or self._waiting or self._pending)

    def counts(self) -> dict[str, int]:
        """Requests by state: queued (arrived, not yet fetched: beyond max_batch_size), active (fetched),
        running (context or generation), waiting for KV capacity, paused now, and totals."""
        waiting_capacity = len(self._unadmitted)
        paused_now = sum(1 for n in self._unadmitted if self._active[n].num_pauses)
        return {"queued": len(self._waiting), "active": len(self._active),
                "running": len(self._gen) + len(self._ctx), "generating": len(self._gen),
                "waitingForCapacity": waiting_capacity, "paused": paused_now,
                "pausedTotal": self._paused_total, "completedTotal": self._completed_total}

    # -- the loop ----------------------------------------------------------------------------------------
    def _arrive(self, upto_s: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= upto_s:
            self._waiting.append(heapq.heappop(pending)[2])

    def _fetch(self) -> None:
        while self._waiting and len(self._active) < self._max_active:
            seq = self._waiting.popleft()
            self._active[seq.seq_no] = seq
            heapq.heappush(self._unadmitted, seq.seq_no)
            self._tuner_dirty = True

    def _round(self, t_s: float) -> bool:
        """One scheduling step: a full iteration, or a collapsed run of identical decode iterations."""
        self._fetch()
        if self._tuning and self._tuner_dirty:
            self._update_tuner()
        self._capacity_step(self._runtime_max_num_tokens() - len(self._gen))
        chunks = self._context_chunks(self._runtime_max_num_tokens() - len(self._gen)) if self._ctx else []
        if not chunks:
            if not self._gen:
                return False
            # pure decode until the next event (a context that does not fit waits for a completion anyway)
            k_safe = self._safe_run_length()
            if k_safe > 1:
                self._decode_run(t_s, k_safe)
                return True
        self._full_iteration(chunks)
        return True

    def _safe_run_length(self) -> int:
        """How many decode iterations may be collapsed without the pool possibly running short."""
        if self._policy is not CapacityPolicy.MAX_UTILIZATION or self._contiguous:
            return 1 << 62
        per_seq = self.pool.free // len(self._gen)
        return (per_seq - 1) * self._tpb if per_seq > 1 else 0

    def _next_finish_G(self) -> int:
        fin = self._fin_heap
        while fin:
            fin_G, seq_no, version = fin[0]
            seq = self._gen.get(seq_no)
            if seq is not None and seq.version == version:
                return fin_G
            heapq.heappop(fin)
        raise RuntimeError("kvsim engine: decoding sequences without a finish entry")

    def _decode_run(self, t_s: float, k_limit: int) -> None:
        n = len(self._gen)
        k = min(self._next_finish_G() - self._G, k_limit)
        bound = t_s
        if self._pending and not self._unadmitted and len(self._active) < self._max_active:
            bound = min(bound, self._pending[0][0])
        if bound != math.inf:
            k = min(k, self.model.decode_iterations_within(n, self._gen_kv, bound - self.now))
        k = max(1, k)
        dt = self.model.decode_run_s(n, self._gen_kv, k)
        self.now += dt
        self.iteration += k
        self._charge_decode_growth(self._G + 2, self._G + k)
        self._G += k
        self._gen_kv += n * k
        self._finish_due()
        self._record_step(dt, k, n, 0, 0)

    def _full_iteration(self, chunks: list) -> None:
        n_gen = len(self._gen)
        dt = self.model.iteration_s(n_gen, self._gen_kv, [(c, s.ctx_done) for s, c in chunks])
        start = self.now
        self.now += dt
        self.iteration += 1
        if n_gen:
            self._G += 1
            self._gen_kv += n_gen
        ctx_tokens = 0
        for seq, chunk in chunks:
            ctx_tokens += chunk
            if seq.state == ADMITTED:
                seq.state = CONTEXT
                if seq.start_s is None:
                    seq.start_s = start
                if self._policy is CapacityPolicy.MAX_UTILIZATION:
                    heapq.heappush(self._started_heap, (-seq.seq_no, seq.version))
            done = seq.ctx_done + chunk
            final = done >= seq.ctx_target
            self._grow(seq, self._blocks_for(seq, done + (1 if final else 0)))
            seq.ctx_done = done
            if final:
                self._context_finished(seq)
        self._finish_due()
        self._record_step(dt, 1, n_gen, len(chunks), ctx_tokens)

    def _context_finished(self, seq: _Seq) -> None:
        """The last chunk ran: its first (or next, after a pause) token exists; register reusable blocks."""
        generated = seq.output_tokens + 1
        seq.output_tokens = generated
        if seq.first_token_s is None:
            seq.first_token_s = self.now
        for block, key in zip(seq.blocks, seq.keys):
            self.pool.register(block, key)
        seq.keyed = min(len(seq.blocks), len(seq.keys))
        del self._ctx[seq.seq_no]
        if generated >= seq.target_output_tokens:
            self._finish(seq, generated)
            return
        seq.state = GENERATION
        seq.gen_base_G = self._G
        seq.gen_base_count = generated
        seq.fin_G = self._G + seq.target_output_tokens - generated
        self._gen[seq.seq_no] = seq
        self._gen_kv += seq.prompt_tokens + generated
        heapq.heappush(self._fin_heap, (seq.fin_G, seq.seq_no, seq.version))
        self._join_buckets(seq)

    def _finish_due(self) -> None:
        fin = self._fin_heap
        while fin and fin[0][0] <= self._G:
            _, seq_no, version = heapq.heappop(fin)
            seq = self._gen.get(seq_no)
            if seq is not None and seq.version == version:
                self._finish(seq, seq.target_output_tokens)

    def _leave_generation(self, seq: _Seq, generated: int) -> None:
        del self._gen[seq.seq_no]
        self._gen_kv -= seq.prompt_tokens + generated

    def _finish(self, seq: _Seq, generated: int) -> None:
        seq.output_tokens = generated
        seq.finish_s = self.now
        self._release_all(seq)
        if seq.state == GENERATION:
            self._leave_generation(seq, generated)
        seq.state = DONE
        seq.version += 1
        del self._active[seq.seq_no]
        self._finished.append(seq)
        self._completed_step += 1
        self._completed_total += 1
        self._tuner_dirty = True

    def _generated(self, seq: RequestRecord) -> int:
        if isinstance(seq, _Seq) and seq.state == GENERATION:
            return seq.gen_base_count + self._G - seq.gen_base_G
        return seq.output_tokens

    # -- limits and tuner --------------------------------------------------------------------------------
    def _runtime_batch_size(self) -> int:
        static = self.config.max_batch_size
        if self.config.enable_batch_size_tuning and self._tuner_bs:
            return min(static, self._tuner_bs)
        return static

    def _runtime_max_num_tokens(self) -> int:
        static = self.config.max_num_tokens
        if self.config.enable_max_num_tokens_tuning and self._tuner_nt:
            return min(static, self._tuner_nt)
        return static

    def _update_tuner(self) -> None:
        self._tuner_dirty = False
        window = list(itertools.islice(reversed(self._active.values()), self.config.tuner_window))
        if not window:
            return
        avg_in = sum(s.prompt_tokens for s in window) / len(window)
        avg_out = sum(s.max_tokens for s in window) / len(window)
        capacity = max_capacity_batch_size(self.memory.num_blocks, avg_in, avg_out, self._tpb)
        if self.config.enable_batch_size_tuning:
            self._tuner_bs = runtime_batch_size(capacity)
        if self.config.enable_max_num_tokens_tuning:
            self._tuner_nt = runtime_max_num_tokens(self._runtime_batch_size(), avg_in, avg_out)

    # -- validation and stats ----------------------------------------------------------------------------
    def _validate(self, prompt: int, max_tokens: int) -> None:
        cfg = self.config
        if prompt < 1 or max_tokens < 1:
            raise RequestRejected(f"prompt length ({prompt}) and max_tokens ({max_tokens}) must be >= 1")
        if prompt > cfg.max_input_len:
            raise RequestRejected(f"Prompt length ({prompt}) exceeds maximum input length ({cfg.max_input_len}).")
        if prompt + max_tokens > cfg.max_seq_len:
            raise RequestRejected(f"The sum of prompt length ({prompt}) and max_tokens ({max_tokens}) should not "
                                  f"exceed max_seq_len ({cfg.max_seq_len})")
        if not self._chunked and prompt > cfg.max_num_tokens:
            raise RequestRejected(f"Without enabling chunked context, the max context length ({prompt}) needs to be "
                                  f"less than or equal to the max number of tokens ({cfg.max_num_tokens}).")
        need = self._contiguous_blocks if self._contiguous else ceil_div(prompt + max_tokens, self._tpb)
        if need > self.memory.num_blocks:
            raise RequestRejected(f"request needs {need} KV blocks (prompt {prompt} + max_tokens {max_tokens}) but "
                                  f"the KV pool has {self.memory.num_blocks}")

    def _record_step(self, dt: float, k: int, n_gen: int, n_ctx: int, ctx_tokens: int) -> None:
        cfg = self.config
        self.last_sample = StepSample(
            self.now, self.iteration, dt * 1000.0 / k, len(self._active), len(self._waiting),
            self._completed_step, self._max_active, cfg.max_batch_size, self._tuner_bs,
            self._runtime_batch_size(), cfg.max_num_tokens, self._tuner_nt, self._runtime_max_num_tokens(),
            int(self.memory.used_bytes), self.memory.num_blocks, self.pool.used, self._tpb, self._alloc_total,
            self._alloc_new, self._reused, self._missed, n_gen + n_ctx, n_ctx, n_gen, self._paused_step,
            ctx_tokens)
        self._stats.append(self.last_sample)
        self._completed_step = self._paused_step = 0
        if self._timeline_interval is not None and self.now >= self._next_sample_s:
            self.timeline.append(self.snapshot())
            self._next_sample_s = (math.floor(self.now / self._timeline_interval) + 1) * self._timeline_interval

    def snapshot(self) -> TimelinePoint:
        kv_tokens = self._gen_kv + sum(s.ctx_done for s in self._ctx.values())
        return TimelinePoint(self.now, self.pool.used, self.memory.num_blocks, self._reserved + self.pool.used,
                             kv_tokens, len(self._active), len(self._waiting),
                             len(self._gen) + len(self._ctx), len(self._unadmitted), self._paused_total,
                             self._completed_total, self._runtime_batch_size())
