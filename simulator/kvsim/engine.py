"""The simulated TensorRT-LLM engine: in-flight batching over a paged KV cache, iteration by iteration.

Speed: between arrivals, completions and context chunks, a batch of decoding sequences repeats the same
iteration with every context one token longer. ``Engine`` collapses such a run into one step: the run's time is
a closed-form arithmetic series (``IterationModel.decode_run_s``), completions come from a heap keyed by the
global decode-iteration counter, and the blocks sequences grow into are counted per phase (a sequence needs a
new block every tokens_per_block iterations, at a fixed phase), so a run costs O(tokens_per_block). Per-request work is therefore
O(log n) per event and O(1) per block, independent of how many iterations it lives.

A run ends at the next completion, at the next arrival that could be admitted, at the ``advance_to`` target,
and (MAX_UTILIZATION) before the pool could run short; that iteration then goes through the full scheduler.
One iteration-stats sample is emitted per step (see ``stats``), unless the engine was built without them.

The batch itself (the fetched requests, their blocks, the decode counter) and the capacity and micro-batch
stages over it are a ``scheduler.Scheduler`` the engine owns; the engine adds time, arrivals, completions and
the statistics. The request checks are ``limits.RequestLimits``, the in-engine tuner ``tuner.InEngineTuner``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque

from .blocks import BlockPool
from .config import CapacityPolicy, EngineConfig, KvCacheType
from .latency import IterationModel
from .limits import RequestLimits, resolved_limits
from .memory import engine_graphs, plan_for
from .request import Request, RequestRecord
from .scheduler import Scheduler
from .sequence import ADMITTED, CONTEXT, DONE, GENERATION, QUEUED, Seq, ceil_div
from .stats import StepSample, TimelinePoint, sample_to_json
from .tuner import InEngineTuner


class Engine:
    """Drive with ``submit`` and ``advance_to``; read ``drain_iteration_stats`` and ``finished_requests``."""

    def __init__(self, config: EngineConfig, *, epoch_s: float | None = None, time_scale: float = 1.0,
                 timeline_interval_s: float | None = None, keep_finished: int | None = None,
                 iteration_stats: bool = True) -> None:
        """``epoch_s``: wall-clock time of simulated t=0 (for timestamps); ``time_scale``: simulated seconds per
        wall second (trtllm-serve's KVSIM_SPEEDUP), so a timestamp is epoch + t / time_scale.
        ``keep_finished``: how many finished-request records to keep (None: all, for offline runs that read
        them at the end; a long-running server passes a bound, since it hands each record to its client).
        ``iteration_stats``: False for a run that reads only its requests' records (the tuner's what-if, a static
        run): no per-iteration sample is built (``last_sample`` stays None, ``drain_iteration_stats`` returns
        none), about 7% of such a run's CPU; the simulation itself is the same."""
        cfg = config.resolved()
        profile = cfg.resolved_profile
        max_seq_len, max_input_len, max_batch_size, max_num_tokens = resolved_limits(cfg)
        self.config = cfg
        self.profile = profile
        self.graphs = engine_graphs(cfg)  # PyTorch backend: the captured CUDA graphs (None on TensorRT)
        self.memory = plan_for(cfg)
        self.model = IterationModel.for_profile(profile, cfg.tokens_per_block, self.graphs)
        self.pool = BlockPool(self.memory.num_blocks, cfg.enable_block_reuse and cfg.kv_cache_type is KvCacheType.PAGED)
        self._tpb = cfg.tokens_per_block
        self._policy = cfg.capacity_policy
        self._chunked = cfg.enable_chunked_context
        self._contiguous = cfg.kv_cache_type is KvCacheType.CONTINUOUS
        self._contiguous_blocks = ceil_div(max_seq_len, cfg.tokens_per_block)
        self._limits = RequestLimits(max_seq_len, max_input_len, max_num_tokens, self._chunked, self._tpb,
                                     self.memory.num_blocks, self._contiguous_blocks if self._contiguous else None)
        self._max_batch_size = max_batch_size
        self._max_num_tokens = max_num_tokens
        self._max_active = max_batch_size * profile.pp
        # The batch (fetched requests, their blocks, the decode counter) and the two scheduling stages over it.
        self._sched = Scheduler(
            pool=self.pool, tpb=self._tpb, policy=self._policy, chunked=self._chunked, contiguous=self._contiguous,
            contiguous_blocks=self._contiguous_blocks, max_batch_size=max_batch_size, batch_size=max_batch_size,
            max_num_tokens=max_num_tokens)
        self.epoch_s = time.time() if epoch_s is None else epoch_s
        self.time_scale = time_scale
        self.last_sample: StepSample | None = None
        self._iteration_stats = iteration_stats
        self.now = 0.0
        self.iteration = 0
        self._seq_numbers = itertools.count()
        self._pending: list[tuple[float, int, Seq]] = []
        self._waiting: deque[Seq] = deque()
        self._fin_heap: list[tuple[int, int, int]] = []
        self._completed_step = self._completed_total = 0
        self._finished: deque[Seq] = deque(maxlen=keep_finished)
        self._stats: deque[StepSample] = deque(maxlen=cfg.iter_stats_max_iterations)
        self._tuner = InEngineTuner(
            window=cfg.tuner_window, num_blocks=self.memory.num_blocks, tokens_per_block=self._tpb,
            tune_batch_size=cfg.enable_batch_size_tuning, tune_num_tokens=cfg.enable_max_num_tokens_tuning,
            max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
        self.timeline: list[TimelinePoint] = []
        self._timeline_interval = timeline_interval_s
        self._next_sample_s = 0.0

    # -- public API --------------------------------------------------------------------------------------
    def submit(self, request: Request, now_s: float | None = None) -> RequestRecord:
        """Queue ``request`` arriving at ``now_s`` (default ``request.arrival_s``); returns its live record.
        Raises RequestRejected with TensorRT-LLM's reason when the engine could never serve it."""
        arrival = request.arrival_s if now_s is None else now_s
        max_tokens = request.max_tokens if request.max_tokens is not None else request.output_tokens
        self._limits.check(request.prompt_tokens, max_tokens)
        seq_no = next(self._seq_numbers)
        seq = Seq(request_id=request.request_id if request.request_id is not None else seq_no,
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
            if not self._sched.active and not self._waiting:
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
        pytorch = self.graphs is not None
        out = [sample_to_json(s, self.epoch_s, self.time_scale, pytorch) for s in self._stats]
        self._stats.clear()
        return out

    def finished_requests(self) -> list[RequestRecord]:
        """Records of every request that finished so far, in finishing order."""
        return list(self._finished)

    def pop_finished(self) -> list[RequestRecord]:
        out: list[RequestRecord] = list(self._finished)
        self._finished.clear()
        return out

    def abort(self, record: RequestRecord) -> bool:
        """Cancel the request behind ``record`` (its client went away), as trtllm-serve aborts the request's
        promise: it leaves the queue or the batch at once and its blocks go back to the pool (full prompt
        blocks stay cached for reuse, as on completion). The record gets ``error="cancelled"`` and a finish
        time; it is not counted as completed. False when the request had already finished."""
        seq = record
        if not isinstance(seq, Seq) or seq.state == DONE:
            return False
        sched = self._sched
        if seq.seq_no in sched.active:
            if seq.state == QUEUED:  # fetched, waiting for capacity (or paused)
                sched.unadmitted.remove(seq.seq_no)
                heapq.heapify(sched.unadmitted)
            elif seq.state in (ADMITTED, CONTEXT):
                del sched.ctx[seq.seq_no]
            generated = sched.generated(seq)
            sched.release_all(seq)
            if seq.state == GENERATION:
                sched.leave_generation(seq, generated)
            seq.output_tokens = generated
            del sched.active[seq.seq_no]
            self._tuner.dirty = True
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
        return self._sched.generated(record) if isinstance(record, Seq) else record.output_tokens

    def check_invariants(self) -> None:
        """Raise AssertionError if the engine's bookkeeping is inconsistent (property tests call this)."""
        self._sched.check_invariants()

    @property
    def idle(self) -> bool:
        return not (self._sched.active or self._waiting or self._pending)

    def outstanding(self) -> int:
        """Requests queued or fetched (``counts()``'s queued + active): what a least-loaded balancer counts, asked
        on every request it routes, so without building the counts."""
        return len(self._waiting) + len(self._sched.active)

    def counts(self) -> dict[str, int]:
        """Requests by state: queued (arrived, not yet fetched: beyond max_batch_size), active (fetched),
        running (context or generation), waiting for KV capacity, paused now, and totals."""
        sched = self._sched
        waiting_capacity = len(sched.unadmitted)
        paused_now = sum(1 for n in sched.unadmitted if sched.active[n].num_pauses)
        return {"queued": len(self._waiting), "active": len(sched.active),
                "running": len(sched.gen) + len(sched.ctx), "generating": len(sched.gen),
                "waitingForCapacity": waiting_capacity, "paused": paused_now,
                "pausedTotal": sched.paused_total, "completedTotal": self._completed_total}

    # -- the loop ----------------------------------------------------------------------------------------
    def _arrive(self, upto_s: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= upto_s:
            self._waiting.append(heapq.heappop(pending)[2])

    def _fetch(self) -> None:
        waiting, active, unadmitted = self._waiting, self._sched.active, self._sched.unadmitted
        while waiting and len(active) < self._max_active:
            seq = waiting.popleft()
            active[seq.seq_no] = seq
            heapq.heappush(unadmitted, seq.seq_no)
            self._tuner.dirty = True

    def _round(self, t_s: float) -> bool:
        """One scheduling step: a full iteration, or a collapsed run of identical decode iterations."""
        sched = self._sched
        self._fetch()
        if self._tuner.enabled and self._tuner.dirty:
            self._tuner.update(reversed(sched.active.values()), sched)
        sched.capacity_step(sched.max_num_tokens - len(sched.gen))
        chunks = sched.context_chunks(sched.max_num_tokens - len(sched.gen)) if sched.ctx else []
        if not chunks:
            if not sched.gen:
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
        per_seq = self.pool.free // len(self._sched.gen)
        return (per_seq - 1) * self._tpb if per_seq > 1 else 0

    def _next_finish_G(self) -> int:
        fin = self._fin_heap
        gen = self._sched.gen
        while fin:
            fin_G, seq_no, version = fin[0]
            seq = gen.get(seq_no)
            if seq is not None and seq.version == version:
                return fin_G
            heapq.heappop(fin)
        raise RuntimeError("kvsim engine: decoding sequences without a finish entry")

    def _decode_run(self, t_s: float, k_limit: int) -> None:
        sched = self._sched
        n = len(sched.gen)
        k = min(self._next_finish_G() - sched.G, k_limit)
        bound = t_s
        if self._pending and not sched.unadmitted and len(sched.active) < self._max_active:
            bound = min(bound, self._pending[0][0])
        if bound != math.inf:
            k = min(k, self.model.decode_iterations_within(n, sched.gen_kv, bound - self.now))
        k = max(1, k)
        dt = self.model.decode_run_s(n, sched.gen_kv, k)
        self.now += dt
        self.iteration += k
        sched.charge_decode_growth(sched.G + 2, sched.G + k)
        sched.G += k
        sched.gen_kv += n * k
        self._finish_due()
        self._record_step(dt, k, n, 0, 0)

    def _full_iteration(self, chunks: list[tuple[Seq, int]]) -> None:
        sched = self._sched
        n_gen = len(sched.gen)
        dt = self.model.iteration_s(n_gen, sched.gen_kv, [(c, s.ctx_done) for s, c in chunks])
        start = self.now
        self.now += dt
        self.iteration += 1
        if n_gen:
            sched.G += 1
            sched.gen_kv += n_gen
        ctx_tokens = 0
        for seq, chunk in chunks:
            ctx_tokens += chunk
            if seq.state == ADMITTED:
                seq.state = CONTEXT
                if seq.start_s is None:
                    seq.start_s = start
                if self._policy is CapacityPolicy.MAX_UTILIZATION:
                    heapq.heappush(sched.started_heap, (-seq.seq_no, seq.version))
            done = seq.ctx_done + chunk
            final = done >= seq.ctx_target
            sched.grow(seq, sched.blocks_for(seq, done + (1 if final else 0)))
            seq.ctx_done = done
            if final:
                self._context_finished(seq)
        self._finish_due()
        self._record_step(dt, 1, n_gen, len(chunks), ctx_tokens)

    def _context_finished(self, seq: Seq) -> None:
        """The last chunk ran: its first (or next, after a pause) token exists; register reusable blocks."""
        sched = self._sched
        generated = seq.output_tokens + 1
        seq.output_tokens = generated
        if seq.first_token_s is None:
            seq.first_token_s = self.now
        for block, key in zip(seq.blocks, seq.keys):
            self.pool.register(block, key)
        seq.keyed = min(len(seq.blocks), len(seq.keys))
        del sched.ctx[seq.seq_no]
        if generated >= seq.target_output_tokens:
            self._finish(seq, generated)
            return
        seq.state = GENERATION
        seq.gen_base_G = sched.G
        seq.gen_base_count = generated
        seq.fin_G = sched.G + seq.target_output_tokens - generated
        sched.gen[seq.seq_no] = seq
        sched.gen_kv += seq.prompt_tokens + generated
        heapq.heappush(self._fin_heap, (seq.fin_G, seq.seq_no, seq.version))
        sched.join_buckets(seq)

    def _finish_due(self) -> None:
        fin = self._fin_heap
        sched = self._sched
        while fin and fin[0][0] <= sched.G:
            _, seq_no, version = heapq.heappop(fin)
            seq = sched.gen.get(seq_no)
            if seq is not None and seq.version == version:
                self._finish(seq, seq.target_output_tokens)

    def _finish(self, seq: Seq, generated: int) -> None:
        sched = self._sched
        seq.output_tokens = generated
        seq.finish_s = self.now
        sched.release_all(seq)
        if seq.state == GENERATION:
            sched.leave_generation(seq, generated)
        seq.state = DONE
        seq.version += 1
        del sched.active[seq.seq_no]
        self._finished.append(seq)
        self._completed_step += 1
        self._completed_total += 1
        self._tuner.dirty = True

    # -- stats ----------------------------------------------------------------------------
    def _record_step(self, dt: float, k: int, n_gen: int, n_ctx: int, ctx_tokens: int) -> None:
        sched = self._sched
        if self._iteration_stats:
            self.last_sample = StepSample(
                self.now, self.iteration, dt * 1000.0 / k, len(sched.active), len(self._waiting),
                self._completed_step, self._max_active, self._max_batch_size, self._tuner.batch_size,
                sched.batch_size, self._max_num_tokens, self._tuner.num_tokens, sched.max_num_tokens,
                int(self.memory.used_bytes), self.memory.num_blocks, self.pool.used, self._tpb, sched.alloc_total,
                sched.alloc_new, sched.reused, sched.missed, n_gen + n_ctx, n_ctx, n_gen, sched.paused_step,
                ctx_tokens)
            self._stats.append(self.last_sample)
        self._completed_step = sched.paused_step = 0
        if self._timeline_interval is not None and self.now >= self._next_sample_s:
            self.timeline.append(self.snapshot())
            self._next_sample_s = (math.floor(self.now / self._timeline_interval) + 1) * self._timeline_interval

    def snapshot(self) -> TimelinePoint:
        sched = self._sched
        kv_tokens = sched.gen_kv + sum(s.ctx_done for s in sched.ctx.values())
        return TimelinePoint(self.now, self.pool.used, self.memory.num_blocks, sched.reserved + self.pool.used,
                             kv_tokens, len(sched.active), len(self._waiting),
                             len(sched.gen) + len(sched.ctx), len(sched.unadmitted), sched.paused_total,
                             self._completed_total, sched.batch_size)

