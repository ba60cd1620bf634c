"""A multi-node group that cannot be placed is never a silent stall: a Pending worker (the leader scheduled,
its worker not) turns Degraded with the scheduler's reason and the pod's name, like a Pending serving pod."""

from __future__ import annotations

from datetime import datetime, timezone

from kvpilot.cli import load_engines
from kvpilot.desired.groups import lws_state
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.plan import Settings, plan
from tests.unit.test_groups import lws
from tests.unit.test_multinode_render import EXAMPLES

NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
WAITING = "0/10 nodes are available: 4 Insufficient nvidia.com/gpu, 6 node(s) didn't match Pod's node affinity"


def test_a_pending_worker_degrades_the_engine_with_the_schedulers_reason() -> None:
    (engine,) = load_engines(str(EXAMPLES[0]))
    fp = plan(engine, Observed(claim_phase="Bound"), Settings(), NOW).fingerprint
    observed = Observed(claim_phase="Bound", engine_index={fp: {"fingerprint": fp}},
                        deployment=lws_state(lws(replicas=2, ready=1)),
                        pods=(PodState("llama-405b-lws-0", True, fp), PodState("llama-405b-lws-1", False, fp)),
                        workers=(PodState("llama-405b-lws-0-1", True, fp),
                                 PodState("llama-405b-lws-1-1", False, fp, unschedulable_message=WAITING)))
    status = plan(engine, observed, Settings(), NOW).status
    degraded, available = status.condition("Degraded"), status.condition("Available")
    assert degraded is not None and degraded.status == "True" and degraded.reason == "InsufficientGPU"
    assert "Pod llama-405b-lws-1-1 cannot be scheduled" in degraded.message and WAITING in degraded.message
    assert available is not None and available.status == "True"  # group 0 serves
    assert status.groups is not None and status.groups.summary == "1/2" and status.ready_replicas == 1
