"""The benchmark fleet: clients that give up are aborted (not served to nobody), the gateway's queue timeout
sheds, the balancer uses a pod with room during a rollout, and a rolled limit is the one the pods run."""

from __future__ import annotations

import pytest
from kvsim import Request

from kvpilot.autotune.fleet import Fleet
from kvpilot.bench.runs import advance_through_rollout
from kvpilot.bench.tuner import engine_config

PROFILE = "llama-3.1-8b-bf16-a100"


def flood(fleet: Fleet, n: int, at: float = 0.0, output: int = 2000) -> list[Request]:
    requests = [Request(prompt_tokens=100, output_tokens=output, max_tokens=output, arrival_s=at + i * 1e-3,
                        request_id=i) for i in range(n)]
    for r in requests:
        fleet.advance(r.arrival_s)
        fleet.submit(r)
    return requests


def test_a_client_that_gives_up_is_aborted_in_its_replica_and_frees_its_slot() -> None:
    fleet = Fleet(engine_config(PROFILE, 64, 8), 1, restart_s=0.0, client_timeout_s=5.0)
    flood(fleet, 20)  # 8 run; 12 wait in the replica's queue (room 2 x 8 + 16)
    assert fleet.replicas[0].engine.counts()["queued"] == 12
    fleet.advance(6.0)
    counts = fleet.replicas[0].engine.counts()
    assert fleet.abandoned == 12 and counts["queued"] == 0 and counts["active"] == 8
    gone = [r for r in fleet.records if r.error == "cancelled"]
    assert len(gone) == 12 and all(r.ttft_s is None for r in gone)  # a miss: never a first token


def test_streaming_requests_are_not_aborted() -> None:
    fleet = Fleet(engine_config(PROFILE, 64, 8), 1, restart_s=0.0, client_timeout_s=5.0)
    flood(fleet, 8)  # each streams for longer than the client timeout
    fleet.advance(300.0)
    assert fleet.abandoned == 0
    assert all(r.error is None and r.finish_s is not None and r.finish_s > 5.0 for r in fleet.records)


def test_the_gateway_sheds_what_is_not_scheduled_in_time() -> None:
    fleet = Fleet(engine_config(PROFILE, 64, 8), 1, restart_s=0.0, queue_timeout_s=1.5)
    flood(fleet, 100)  # 8 run, 24 wait in the replica (room 2 x 8 + 16), 68 at the balancer
    fleet.advance(2.0)
    assert fleet.shed == 24 and fleet.dropped == 68 and fleet.gave_up == 92
    assert fleet.replicas[0].engine.counts()["active"] == 8


def test_without_a_queue_timeout_nothing_is_shed_before_the_client_timeout() -> None:
    fleet = Fleet(engine_config(PROFILE, 64, 8), 1, restart_s=0.0)
    flood(fleet, 100)
    fleet.advance(30.0)
    assert fleet.gave_up == 0


def test_a_rolled_limit_is_in_force_and_the_balancer_uses_the_pod_with_room() -> None:
    fleet = Fleet(engine_config(PROFILE, 512, 8), 2, restart_s=10.0, surge=True)
    fleet.roll_to(engine_config(PROFILE, 512, 256))
    fleet.advance(11.0)  # the first surge pod is Ready; one old pod (limit 8) still serves
    limits = sorted(r.config.max_batch_size for r in fleet.replicas if r.state == "up")
    assert limits == [8, 256]
    flood(fleet, 200, at=11.0)
    new = next(r for r in fleet.replicas if r.config.max_batch_size == 256)
    assert new.engine.counts()["active"] > 8  # the raised limit admits more than the old one could
    assert not fleet.backlog  # the old pod is full, the new one takes the rest
    while fleet.rolling():
        fleet.advance(fleet.next_transition())
    assert {r.config.max_batch_size for r in fleet.replicas} == {256}


def _rollout_seconds(fleet: Fleet) -> float:
    while fleet.rolling():
        fleet.advance(fleet.next_transition())
    return fleet.now


def test_surge_starts_as_many_new_pods_as_spare_gpus_and_never_drops_capacity() -> None:
    """maxSurge 1: the second new pod waits until the first old one has drained and freed its GPU, so the
    rollout takes two start-to-Ready times; maxSurge 2 (a spare GPU per replica): one."""
    one = Fleet(engine_config(PROFILE, 512, 8), 2, restart_s=90.0, surge=True, max_surge=1)
    one.roll_to(engine_config(PROFILE, 512, 256))
    assert sum(1 for r in one.replicas if r.replaces is not None) == 1
    both = Fleet(engine_config(PROFILE, 512, 8), 2, restart_s=90.0, surge=True, max_surge=2)
    both.roll_to(engine_config(PROFILE, 512, 256))
    assert sum(1 for r in both.replicas if r.replaces is not None) == 2
    assert sum(1 for r in both.replicas if r.state == "up") == 2  # the old pods serve meanwhile
    assert _rollout_seconds(one) >= 180.0
    assert _rollout_seconds(both) < 180.0
    for fleet in (one, both):
        assert len(fleet.replicas) == 2 and {r.config.max_batch_size for r in fleet.replicas} == {256}


def test_a_canary_rolls_one_pod_then_is_promoted_or_rolled_back() -> None:
    """roll_to(config, pods=1) pauses the rollout after the first pod (a canary); roll_to(config) promotes it;
    roll_to(old) instead rolls only the canary back."""
    for surge in (True, False):
        old, new = engine_config(PROFILE, 512, 8), engine_config(PROFILE, 512, 256)
        fleet = Fleet(old, 2, restart_s=10.0, surge=surge, max_surge=2)
        fleet.roll_to(new, pods=1)
        _rollout_seconds(fleet)
        assert sorted(r.config.max_batch_size for r in fleet.replicas) == [8, 256], surge
        fleet.roll_to(old)
        _rollout_seconds(fleet)
        assert {r.config.max_batch_size for r in fleet.replicas} == {8} and len(fleet.replicas) == 2
        fleet.roll_to(new, pods=1)
        _rollout_seconds(fleet)
        fleet.roll_to(new)
        _rollout_seconds(fleet)
        assert {r.config.max_batch_size for r in fleet.replicas} == {256} and len(fleet.replicas) == 2


def test_a_surge_pod_not_yet_ready_is_cancelled_when_the_change_is_taken_back() -> None:
    old, new = engine_config(PROFILE, 512, 8), engine_config(PROFILE, 512, 256)
    fleet = Fleet(old, 2, restart_s=90.0, surge=True, max_surge=2)
    fleet.roll_to(new)
    assert len(fleet.replicas) == 4
    fleet.advance(10.0)
    fleet.roll_to(old)
    assert len(fleet.replicas) == 2 and not fleet.rolling()
    assert {r.config.max_batch_size for r in fleet.replicas} == {8}


def test_a_canary_is_sent_its_share_not_what_a_least_loaded_choice_gives_it() -> None:
    """With one canary of two pods, every other request goes to it, although its larger limit leaves it more
    room (least-loaded routing would favour it; a Service spreads connections evenly)."""
    old, new = engine_config(PROFILE, 512, 8), engine_config(PROFILE, 512, 256)
    fleet = Fleet(old, 2, restart_s=1.0, surge=True, max_surge=2)
    fleet.roll_to(new, pods=1)
    _rollout_seconds(fleet)
    flood(fleet, 40, at=fleet.now)
    sent = {r.name: sum(1 for x in fleet.records if fleet.pod_of(x) == r.name) for r in fleet.replicas}
    canary = next(r.name for r in fleet.replicas if r.config == new)
    assert sent[canary] == 20, sent


def test_the_tally_counts_what_each_pod_resolved() -> None:
    from kvpilot.bench.tally import Tally

    fleet = Fleet(engine_config(PROFILE, 64, 8), 2, restart_s=0.0, queue_timeout_s=1.5)
    tally = Tally(fleet, ttft_ms=3000.0, tpot_ms=60.0)
    flood(fleet, 100, output=20)  # 16 run (8 per pod), some wait, the rest is shed
    fleet.advance(15.0)
    whole, pods = tally.interval(0.0, 15.0, 100, 2)
    assert whole.offered == 100 and whole.resolved == 100  # answered, shed in a pod, or dropped at the balancer
    assert 0 < whole.good == whole.answered < 100
    assert sum(p.resolved for p in pods.values()) == 100 - fleet.dropped
    assert sum(p.good for p in pods.values()) == whole.good
    again, _ = tally.interval(15.0, 30.0, 0, 2)
    assert again.resolved == 0  # each request counts once


@pytest.mark.parametrize("surge", [True, False])
def test_a_fleet_without_iteration_stats_serves_the_same_through_a_rollout(surge: bool) -> None:
    """The what-if's and the static runs' fleets build no iteration stats, also in the pods a rollout starts
    (a surge pod, or a pod restarted in place); every request is served to the same bit as by a fleet that
    builds them, the new pods' included."""
    def run(stats: bool) -> tuple[list[tuple[object, ...]], Fleet]:
        fleet = Fleet(engine_config(PROFILE, 64, 8), 2, restart_s=30.0, surge=surge, iteration_stats=stats)
        requests = [Request(prompt_tokens=100, output_tokens=300, max_tokens=300, arrival_s=0.5 * i, request_id=i)
                    for i in range(400)]
        for r in requests:
            if r.request_id == 20:
                fleet.roll_to(engine_config(PROFILE, 64, 32))
            advance_through_rollout(fleet, r.arrival_s)
            fleet.submit(r)
        advance_through_rollout(fleet, 400.0)
        return [(r.request_id, r.first_token_s, r.finish_s, r.error) for r in fleet.records], fleet
    served, with_stats = run(True)
    served_without, without = run(False)
    assert served_without == served and len(served) == 400
    rolled = [r for r in without.replicas if r.restarts and r.engine.finished_requests()]  # a new engine served
    assert rolled and all(r.config.max_batch_size == 32 for r in rolled)  # the rollout's pods served too
    assert all(r.engine.drain_iteration_stats() == [] and r.engine.last_sample is None for r in without.replicas)
    assert all(r.engine.last_sample is not None for r in with_stats.replicas if r.sent)
