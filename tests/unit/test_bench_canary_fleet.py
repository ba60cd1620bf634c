"""The live canary in the benchmark's fleet (bench/canary_fleet.py): the operator's plan() starts a canary for
the tuner's first raise on long-output-a100, the fleet holds one pod at the new value while the others keep the
old one, and the plan promotes it on the canary's own figures; every pod then runs it. (The canary's rollback
is driven through plan() in tests/unit/test_plan_canary.py, and on the local cluster in tests/e2e/test_canary.py.)"""

from __future__ import annotations

from typing import Any

from kvpilot.bench.cases import case_named
from kvpilot.bench.perturb import perturbation_named, served_profile
from kvpilot.bench.runs import Served
from kvpilot.bench.tuner import run_autotuned

MINUTES = 8


def tuned(perturbation: str) -> dict[str, Any]:
    case = case_named("long-output-a100")
    served = Served(case, perturbation_named(perturbation))
    requests = [r for r in case.requests() if r.arrival_s < 60 * MINUTES]
    return run_autotuned(requests, case.profile, 1024, case.replicas, case.restart_s, served.slo,
                         60 * MINUTES + 120.0, 60.0 * MINUTES, start=64, policy=case.policy, autotune_max=1024,
                         spare_gpu=False, queue_timeout_s=case.queue_timeout_s,
                         served=served_profile(case.profile, served.perturbation), canary="Auto")


def test_a_good_raise_is_tried_on_one_pod_then_promoted_to_both() -> None:
    out = tuned("nominal")
    (canary, *_rest) = out["canaries"]
    assert canary["from"] == 64 and canary["to"] > 64 and canary["outcome"] == "Promoted", out["canaries"]
    assert canary["spare"] is False and canary["endSeconds"] > canary["startSeconds"]
    promoted = next(h for h in out["history"] if h["to"] == canary["to"])
    assert promoted["atSeconds"] == canary["endSeconds"] and "promoted after its canary" in promoted["message"]
    assert out["final"] >= canary["to"]
