"""An engine that builds no iteration stats (the tuner's what-if, static runs) serves exactly as one that does."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvsim.engine import Engine
from kvsim.request import Request, RequestRejected

from .helpers import small_config

requests = st.lists(st.tuples(st.integers(1, 600), st.integers(1, 300), st.floats(0, 0.2)), min_size=1, max_size=30)
configs = st.fixed_dictionaries({
    "capacity_policy": st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]),
    "max_batch_size": st.integers(1, 16),
    "enable_chunked_context": st.booleans(),
    "enable_batch_size_tuning": st.booleans(),
})


def _serve(cfg: dict, reqs: list[tuple[int, int, float]], stats: bool) -> tuple[Engine, list[tuple], list[int]]:
    engine = Engine(small_config(max_seq_len=1024, build_max_num_tokens=512, **cfg), epoch_s=0.0,
                    iteration_stats=stats)
    for i, (prompt, out, gap) in enumerate(reqs):
        try:
            engine.submit(Request(prompt, out, arrival_s=gap * i, request_id=i))
        except RequestRejected:
            continue
    outstanding = []
    while not engine.idle:
        engine.advance_to(engine.now + 0.01)
        counts = engine.counts()
        assert engine.outstanding() == counts["queued"] + counts["active"]
        outstanding.append(engine.outstanding())
    records = [(r.request_id, r.first_token_s, r.finish_s, r.output_tokens) for r in engine.finished_requests()]
    return engine, records, outstanding


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, reqs=requests)
def test_the_same_requests_are_served_alike_without_iteration_stats(cfg, reqs):
    with_stats, served, load = _serve(cfg, reqs, True)
    without, served_without, load_without = _serve(cfg, reqs, False)
    assert served_without == served and load_without == load  # to the bit: the same floats, the same order
    assert without.last_sample is None and without.drain_iteration_stats() == []
    assert with_stats.last_sample is not None or not served
