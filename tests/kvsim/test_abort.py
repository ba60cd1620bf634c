"""Engine.abort: a request whose client went away leaves the engine in any state it is in, freeing its
slot and blocks, and the engine's bookkeeping stays consistent (issue 13, item 8)."""

from __future__ import annotations

import random

import pytest
from kvsim.request import Request


@pytest.mark.parametrize("policy", ["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"])
def test_aborting_requests_in_every_state_returns_the_engine_to_idle(make_engine, policy: str) -> None:
    engine = make_engine(capacity_policy=policy, max_batch_size=8)
    rng = random.Random(7)
    records = [engine.submit(Request(rng.randint(20, 400), 1500, max_tokens=1500, arrival_s=i * 0.002,
                                     request_id=i)) for i in range(40)]
    engine.advance_to(0.01)  # some arrived and run, some queue, some are still in the future
    states = set()
    for _ in range(30):
        engine.advance_to(engine.now + 0.05)
        engine.check_invariants()
        live = [r for r in records if r.finish_s is None]
        if not live:
            break
        victim = rng.choice(live)
        states.add(getattr(victim, "state", None))
        assert engine.abort(victim)
        assert victim.error == "cancelled" and victim.finish_s is not None
        engine.check_invariants()
    for r in records:
        if r.finish_s is None:
            engine.abort(r)
    engine.check_invariants()
    assert engine.idle and engine.pool.used == 0
    assert len(states) >= 2  # aborted from more than one state (queued, running, ...)
    completed = engine.counts()["completedTotal"]
    assert completed == sum(1 for r in records if r.error is None)


def test_abort_of_a_finished_request_is_a_no_op(make_engine) -> None:
    engine = make_engine()
    record = engine.submit(Request(10, 3, request_id="x"))
    engine.run_until_idle()
    assert not engine.abort(record) and record.error is None


def test_a_bounded_engine_keeps_no_more_records_than_asked(make_engine) -> None:
    from kvsim.engine import Engine

    from .helpers import small_config

    engine = Engine(small_config(), epoch_s=0.0, keep_finished=5)
    for i in range(50):
        engine.submit(Request(10, 2, arrival_s=i * 0.01, request_id=i))
    engine.run_until_idle()
    assert [r.request_id for r in engine.finished_requests()] == [45, 46, 47, 48, 49]
