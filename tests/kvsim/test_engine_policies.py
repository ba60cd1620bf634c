"""Scheduler semantics: TensorRT-LLM's capacity policies, runtime limits, chunked context, reuse, rejection."""

from __future__ import annotations

import pytest
from kvsim.config import EngineConfig
from kvsim.engine import Engine
from kvsim.request import Request, RequestRejected

from .helpers import run_all, small_config


def by_id(engine: Engine) -> dict:
    return {r.request_id: r for r in engine.finished_requests()}


def test_guaranteed_no_evict_is_strict_fifo_on_reservations(make_engine):
    engine = make_engine(capacity_policy="GUARANTEED_NO_EVICT")  # 256 blocks of 16 tokens
    run_all(engine, [
        Request(100, 50, max_tokens=3000, arrival_s=0.0, request_id="A"),   # reserves 194 blocks
        Request(100, 20, max_tokens=2000, arrival_s=0.001, request_id="B"),  # needs 132: must wait for A
        Request(10, 5, max_tokens=10, arrival_s=0.002, request_id="C"),      # would fit, but B is first
    ], step_s=0.01)
    r = by_id(engine)
    assert r["B"].start_s >= r["A"].finish_s
    assert r["C"].start_s >= r["B"].start_s
    assert all(x.num_pauses == 0 for x in r.values())


def test_max_utilization_admits_on_actual_use_and_pauses_the_newest(make_engine):
    engine = make_engine(capacity_policy="MAX_UTILIZATION")
    reqs = [Request(100, 1400, max_tokens=1400, arrival_s=i * 1e-3, request_id=n) for i, n in enumerate("ABC")]
    run_all(engine, reqs, step_s=0.05)
    r = by_id(engine)
    assert r["B"].start_s < r["A"].finish_s  # admitted while A runs: no reservation
    assert r["C"].num_pauses >= 1 and r["A"].num_pauses == 0
    assert all(x.output_tokens == 1400 for x in r.values())
    assert engine.counts()["pausedTotal"] >= 1


def test_static_batch_admits_only_between_batches(make_engine):
    reqs = [Request(100, 400, arrival_s=0.0, request_id="A"), Request(50, 10, arrival_s=0.05, request_id="B")]
    static = make_engine(capacity_policy="STATIC_BATCH")
    run_all(static, list(reqs))
    inflight = make_engine(capacity_policy="GUARANTEED_NO_EVICT")
    run_all(inflight, [Request(100, 400, arrival_s=0.0, request_id="A"),
                       Request(50, 10, arrival_s=0.05, request_id="B")])
    assert by_id(static)["B"].start_s >= by_id(static)["A"].finish_s
    assert by_id(inflight)["B"].finish_s < by_id(inflight)["A"].finish_s


def test_runtime_max_batch_size_caps_concurrency(make_engine):
    engine = make_engine(max_batch_size=2)
    for i in range(6):
        engine.submit(Request(50, 200, arrival_s=0.0, request_id=i))
    peak = 0
    while not engine.idle:
        engine.advance_to(engine.now + 0.005)
        peak = max(peak, engine.counts()["running"])
        engine.check_invariants()
    assert peak == 2
    stats = engine.drain_iteration_stats()
    assert stats and all(s["maxBatchSizeRuntime"] == 2 and s["maxBatchSizeStatic"] == 2 for s in stats)


def test_runtime_limits_above_the_engine_are_refused_with_tensorrt_llm_wording():
    with pytest.raises(ValueError, match=r"max_batch_size \[128\] is greater than build_config.max_batch_size \[64\]"):
        small_config(max_batch_size=128).resolved()
    with pytest.raises(ValueError, match="max_num_tokens"):
        small_config(max_num_tokens=4096).resolved()


@pytest.mark.parametrize("request_args, reason", [
    (dict(prompt_tokens=5000, output_tokens=1), "maximum input length"),
    (dict(prompt_tokens=3000, output_tokens=10), "chunked context"),
    (dict(prompt_tokens=100, output_tokens=10, max_tokens=4000), "max_seq_len"),
])
def test_impossible_requests_are_rejected(make_engine, request_args, reason):
    engine = make_engine(max_input_len=4000)
    with pytest.raises(RequestRejected, match=reason):
        engine.submit(Request(**request_args))


def test_a_request_larger_than_the_pool_is_rejected(make_engine):
    engine = make_engine(kv_max_tokens=1024, enable_chunked_context=True)
    with pytest.raises(RequestRejected, match="KV pool"):
        engine.submit(Request(1000, 10, max_tokens=100))


def test_chunked_context_splits_prompts_in_block_multiples(make_engine):
    engine = make_engine(enable_chunked_context=True, build_max_num_tokens=1000, kv_max_tokens=8192,
                         max_seq_len=8192)
    run_all(engine, [Request(2500, 3, request_id="long")])
    chunks = [s["inflightBatchingStats"]["numCtxTokens"] for s in engine.drain_iteration_stats()
              if s["inflightBatchingStats"]["numContextRequests"]]
    assert chunks == [992, 992, 516]  # floor(1000 / 16) * 16, then the remainder
    assert by_id(engine)["long"].output_tokens == 3


def test_single_request_latency_follows_the_iteration_model(make_engine):
    engine = make_engine()
    run_all(engine, [Request(300, 11, request_id="x")])
    r = by_id(engine)["x"]
    m = engine.model
    assert r.ttft_s == pytest.approx(m.iteration_s(0, 0, [(300, 0)]))
    decode = sum(m.iteration_s(1, 301 + i, []) for i in range(10))
    assert r.finish_s - r.first_token_s == pytest.approx(decode)
    assert r.tpot_s == pytest.approx(decode / 10)


def test_collapsed_runs_equal_step_by_step_simulation():
    reqs = [Request(100 + 37 * i, 20 + 13 * i, max_tokens=400, arrival_s=0.003 * i, request_id=i) for i in range(40)]
    coarse = Engine(small_config(), epoch_s=0.0)
    run_all(coarse, [Request(**{f: getattr(r, f) for f in r.__slots__}) for r in reqs])
    fine = Engine(small_config(), epoch_s=0.0)
    run_all(fine, reqs, step_s=0.0005)
    assert fine.iteration == coarse.iteration
    for i, r in by_id(coarse).items():
        assert by_id(fine)[i].finish_s == pytest.approx(r.finish_s, rel=1e-9)
        assert by_id(fine)[i].first_token_s == pytest.approx(r.first_token_s, rel=1e-9)


def test_prefix_reuse_skips_cached_blocks(make_engine):
    engine = make_engine()
    run_all(engine, [Request(640, 2, prefix_id="sys", prefix_tokens=512, request_id="first"),
                     Request(640, 2, prefix_id="sys", prefix_tokens=512, arrival_s=1.0, request_id="second")])
    r = by_id(engine)
    assert r["first"].reused_blocks == 0 and r["second"].reused_blocks == 32
    assert r["second"].ttft_s < r["first"].ttft_s
    last = engine.drain_iteration_stats()[-1]["kvCacheStats"]
    assert last["reusedBlocks"] == 32 and last["cacheHitRate"] > 0


def test_block_reuse_off_never_shares(make_engine):
    engine = make_engine(enable_block_reuse=False)
    run_all(engine, [Request(640, 2, prefix_id="sys", prefix_tokens=512, arrival_s=i * 1.0) for i in range(2)])
    assert all(r.reused_blocks == 0 for r in engine.finished_requests())


def test_contiguous_reservation_admits_fewer_requests_than_paged():
    def peak(kv_type: str) -> int:
        engine = Engine(small_config(kv_cache_type=kv_type, kv_max_tokens=16384, max_seq_len=2048), epoch_s=0.0)
        for i in range(40):
            engine.submit(Request(200, 100, max_tokens=100, request_id=i))
        best = 0
        while not engine.idle:
            engine.advance_to(engine.now + 0.01)
            best = max(best, engine.counts()["running"])
        return best

    assert peak("continuous") == 8  # 16384 / 2048
    assert peak("paged") > 8


def test_dynamic_batch_tuner_follows_tensorrt_llm_table():
    engine = Engine(EngineConfig(enable_batch_size_tuning=True, max_seq_len=8192), epoch_s=0.0)
    for i in range(10):
        engine.submit(Request(1000, 10, max_tokens=1000, request_id=i))
    engine.run_until_idle()
    stats = engine.drain_iteration_stats()
    blocks = engine.memory.num_blocks
    capacity = blocks // 63  # ceil((1000 + 1000) / 32) blocks per average request
    assert 336 <= capacity < 672  # the table row "< 672 -> 512"
    assert stats[0]["maxBatchSizeTunerRecommended"] == 512
    assert stats[0]["maxBatchSizeRuntime"] == 512 and stats[0]["maxBatchSizeStatic"] == 2048


def test_tuner_table_edges():
    from kvsim.tuner import runtime_batch_size, runtime_max_num_tokens

    assert [runtime_batch_size(c) for c in (10, 143, 144, 671, 831, 1279, 1663)] == [128, 128, 256, 512, 768,
                                                                                    1024, 1536]
    assert runtime_batch_size(2100) == 2048  # within 128 of a multiple of 512: rounded down
    assert runtime_batch_size(2300) == 2300
    assert runtime_max_num_tokens(256, 2000, 200) == 8192  # context heavy floor
    assert runtime_max_num_tokens(256, 100, 1000) == 2048
