"""Property tests: whatever the workload and configuration, the pool stays consistent and work completes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvsim.engine import Engine
from kvsim.request import Request, RequestRejected

from .helpers import small_config

requests = st.lists(
    st.tuples(st.integers(1, 600), st.integers(1, 300), st.integers(0, 300), st.floats(0, 0.2),
              st.integers(0, 3), st.integers(0, 300)),
    min_size=1, max_size=40)
configs = st.fixed_dictionaries({
    "capacity_policy": st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH"]),
    "tokens_per_block": st.sampled_from([4, 8, 16, 64]),
    "kv_max_tokens": st.sampled_from([1024, 2048, 4096]),
    "max_batch_size": st.integers(1, 16),
    "enable_chunked_context": st.booleans(),
    "enable_block_reuse": st.booleans(),
    "kv_cache_type": st.sampled_from(["paged", "paged", "continuous"]),
    "enable_batch_size_tuning": st.booleans(),
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, reqs=requests, step=st.sampled_from([0.002, 0.01, 0.1]))
def test_pool_invariants_hold_and_every_request_finishes(cfg, reqs, step):
    engine = Engine(small_config(max_seq_len=1024, build_max_num_tokens=512, **cfg), epoch_s=0.0)
    accepted = {}
    for i, (prompt, out, extra, gap, group, shared) in enumerate(reqs):
        request = Request(prompt, out, max_tokens=out + extra, arrival_s=gap * i, request_id=i,
                          prefix_id=group, prefix_tokens=shared)
        try:
            accepted[i] = engine.submit(request)
        except RequestRejected:
            continue
    peak = 0
    while not engine.idle:
        engine.advance_to(engine.now + step)
        engine.check_invariants()  # no block owned twice, pool never over-committed, reservations hold
        peak = max(peak, engine.counts()["running"])
        assert engine.pool.used <= engine.pool.num_blocks
    finished = {r.request_id: r for r in engine.finished_requests()}
    assert finished.keys() == accepted.keys()  # every accepted request finishes
    for i, record in finished.items():
        assert record.output_tokens == record.target_output_tokens
        assert record.arrival_s <= record.start_s <= record.first_token_s <= record.finish_s
        if cfg["capacity_policy"] != "MAX_UTILIZATION":
            assert record.num_pauses == 0  # a started request is never paused without MAX_UTILIZATION
    assert engine.pool.used == 0 and engine.pool.charged == 0
    assert peak <= cfg["max_batch_size"]
