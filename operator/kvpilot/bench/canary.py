"""What a bad change costs before it is caught: verification after a full rollout against a canary pod, with and
without a spare GPU (issue 18, "Canary retunes"). ``python -m kvpilot.bench.canary``.

One change is forced at ``at_s`` (the tuner's own first change on the issue's example, 64 -> 512 on
long-output-a100 whose engine decodes ~20% slower than its profile; here 120 s in, once the pods at 64 have a
settled baseline to be judged against), then:

* ``none``: nothing checks it (the tuner before issue 18 held 512 for the rest of the run);
* ``verify``: every pod rolls; once the new limit is in force, ``verify.verify`` compares the fleet with the
  windows before the change and rolls back what serves worse;
* ``canary``: one pod rolls first (with a spare GPU it starts beside the old pods and takes over one of them, so
  capacity never drops; without one, the first replaced pod is the canary), ``verify.verify_canary`` compares it
  with the old pod behind the same balancer, then the rest follows (promote) or the canary rolls back.

The cost is the good requests lost against never changing (static ``from_value`` on the same requests). The same
runs on the nominal engine say what the check costs a change that was good (the gain it delays).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvsim import Request

from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.verification import verify, verify_canary
from kvpilot.autotune.verify import Outcome, Verdict, WindowFigures
from kvpilot.bench.cases import Case, case_named
from kvpilot.bench.perturb import perturbation_named
from kvpilot.bench.runs import Served, advance_through_rollout, run_static_records
from kvpilot.bench.tally import Tally

INTERVAL = 15.0
MODES = ("none", "verify", "canary")


def _good_after(fleet: Fleet, served: Served, since_s: float, until_s: float) -> int:
    slo = served.slo
    return sum(1 for r in fleet.records if since_s <= r.arrival_s < until_s and r.error is None
               and r.finish_s is not None and r.ttft_s is not None and r.ttft_s * 1e3 <= slo.ttft_ms
               and (r.tpot_s is None or r.tpot_s * 1e3 <= slo.tpot_ms))


class _Check:
    """The verification state of one run: the windows on each side, the verdict once there is one."""

    def __init__(self, mode: str, from_value: int, to_value: int, at_s: float) -> None:
        self.mode, self.from_value, self.to_value, self.at_s = mode, from_value, to_value, at_s
        self.fleet_windows: list[WindowFigures] = []
        self.canary: list[WindowFigures] = []
        self.others: list[WindowFigures] = []
        self.verdict: Verdict | None = None
        self.decided_at: float | None = None
        self.restored_at: float | None = None

    def step(self, fleet: Fleet, served: Served, whole: WindowFigures, pods: dict[str, WindowFigures],
             now_s: float) -> None:
        self.fleet_windows.append(whole)
        if self.mode == "none" or now_s <= self.at_s or self.verdict is not None:
            return
        if self.mode == "canary":
            for name, w in pods.items():
                (self.canary if w.limit == self.to_value else self.others).append(w)
            verdict = verify_canary(self.from_value, self.to_value, self.canary, self.others, self.at_s, now_s)
        else:
            verdict = verify(self.at_s, self.from_value, self.to_value, self.fleet_windows, self.fleet_windows, now_s)
        if verdict.outcome == Outcome.UNDECIDED:
            return
        self.verdict, self.decided_at = verdict, now_s
        target = self.to_value if verdict.outcome == Outcome.KEEP else self.from_value
        fleet.roll_to(served.config(target))


def run_change(requests: list[Request], served: Served, from_value: int, to_value: int, at_s: float,
               mode: str, duration_s: float) -> dict[str, Any]:
    """``requests`` on a fleet at ``from_value`` that changes to ``to_value`` at ``at_s``, checked by ``mode``."""
    case = served.case
    fleet = Fleet(served.config(from_value), case.replicas, case.restart_s, surge=case.spare_gpu,
                  queue_timeout_s=case.queue_timeout_s, max_surge=case.replicas)
    tally = Tally(fleet, case.ttft_ms, case.tpot_ms)
    check = _Check(mode, from_value, to_value, at_s)
    next_tick, i, arrived, changed = INTERVAL, 0, 0, False
    while next_tick <= duration_s:
        while i < len(requests) and requests[i].arrival_s < next_tick:
            if not changed and requests[i].arrival_s >= at_s:
                advance_through_rollout(fleet, at_s)
                fleet.roll_to(served.config(to_value), pods=1 if mode == "canary" else None)
                changed = True
            advance_through_rollout(fleet, requests[i].arrival_s)
            fleet.submit(requests[i])
            i += 1
        advance_through_rollout(fleet, next_tick)
        whole, pods = tally.interval(next_tick - INTERVAL, next_tick, i - arrived, case.replicas)
        arrived = i
        check.step(fleet, served, whole, pods, next_tick)
        if check.verdict is not None and check.restored_at is None and not fleet.rolling():
            check.restored_at = next_tick
        next_tick += INTERVAL
    advance_through_rollout(fleet, duration_s + 120.0)
    verdict = check.verdict
    return {"mode": mode, "good": _good_after(fleet, served, at_s, duration_s),
            "verdict": None if verdict is None else verdict.outcome.value,
            "caughtAfterSeconds": None if check.decided_at is None else check.decided_at - at_s,
            "settledAfterSeconds": None if check.restored_at is None else check.restored_at - at_s,
            "message": None if verdict is None else verdict.message[:400]}


def evaluate(case: Case, perturbation: str, from_value: int, to_value: int, at_s: float, duration_s: float,
             spare_gpu: bool) -> dict[str, Any]:
    """Every mode on ``case``'s first ``duration_s`` of traffic, against never changing."""
    from dataclasses import replace

    served = Served(replace(case, spare_gpu=spare_gpu), perturbation_named(perturbation))
    requests = [r for r in case.requests() if r.arrival_s < duration_s]
    base_records = run_static_records(requests, served, served.config(from_value), duration_s + 120.0)[1]
    baseline = sum(1 for r in base_records if at_s <= r.arrival_s < duration_s and r.error is None
                   and r.finish_s is not None and r.ttft_s is not None and r.ttft_s * 1e3 <= case.ttft_ms
                   and (r.tpot_s is None or r.tpot_s * 1e3 <= case.tpot_ms))
    runs = []
    for mode in MODES:
        out = run_change(requests, served, from_value, to_value, at_s, mode, duration_s)
        out["lostGoodRequests"] = baseline - out["good"]
        runs.append(out)
    return {"case": case.name, "perturbation": perturbation, "spareGpu": spare_gpu, "from": from_value,
            "to": to_value, "atSeconds": at_s, "durationSeconds": duration_s, "staticGood": baseline, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvpilot.bench.canary",
                                description="The good requests a bad change costs before it is caught: no check, "
                                            "verification after a full rollout, and a canary pod; with and without "
                                            "a spare GPU, on a bad engine and on the nominal one.")
    p.add_argument("--case", default="long-output-a100")
    p.add_argument("--perturbation", action="append", default=None,
                   help="served engine(s) (default: decode0.8-perseq1.5 and nominal)")
    p.add_argument("--from-value", type=int, default=64)
    p.add_argument("--to-value", type=int, default=512)
    p.add_argument("--at-seconds", type=float, default=120.0)
    p.add_argument("--duration-seconds", type=float, default=720.0)
    args = p.parse_args(argv)
    try:
        case = case_named(args.case)
        perturbations = args.perturbation or ["decode0.8-perseq1.5", "nominal"]
        for name in perturbations:
            perturbation_named(name)
    except KeyError as exc:
        print(f"kvpilot bench canary: {exc.args[0]}", file=sys.stderr)
        return 2
    started = time.process_time()
    out = [evaluate(case, name, args.from_value, args.to_value, args.at_seconds, args.duration_seconds, spare)
           for name in perturbations for spare in (True, False)]
    print(json.dumps({"results": out, "cpuSeconds": time.process_time() - started}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
