"""``kvpilot bench tuner``: the autotuner against static max_batch_size settings, on kvsim, in simulated time.

The autotuned run drives the operator's own code: every tuning interval it drains each replica's
iteration stats (the JSON ``/metrics`` returns), parses them with ``kvpilot.trtllm.metrics``, summarizes
them with ``kvpilot.autotune.summarize`` and hands an ``Observed`` to ``kvpilot.desired.plan.plan`` — the same
pure function the operator runs — then rolls whatever the plan's status puts in force. Baselines:

* ``seedDefault``: the blog's static 64 (an engine built for 64);
* ``trtllmDefault``: TensorRT-LLM's defaults, a 2048 ceiling with its in-engine batch-size tuner;
* ``oracle``: the best static max_batch_size found by sweeping (each built for its own value).

Goodput = requests per second that meet both SLOs; unfinished and rejected requests count as misses.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import sys
from collections import deque
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from kvsim import EngineConfig, Request, RequestRecord
from kvsim.profiles import Profile
from kvsim.workload import load_workload

from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.status import BatchingStatus, EngineStatus
from kvpilot.api.validate import validate_manifest
from kvpilot.autotune.whatif import SHED_SHARE, sim_config
from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.window import KvWindow
from kvpilot.desired.observed import DeploymentState, Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.autotune.burst import BURST_HISTORY_SECONDS
from kvpilot.bench.window import Slo as Slo
from kvpilot.bench.window import PodReadings, drain, per_period, window_of
from kvpilot.bench.canary_fleet import CanaryFleet
from kvpilot.observe.scrape import sample_seconds
from kvpilot.planning import Planner

SWEEP = (16, 32, 64, 128, 256, 512, 1024, 2048)
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


def goodput(records: list[RequestRecord], total: int, slo: Slo, duration_s: float) -> dict[str, float]:
    good = sum(
        1 for r in records
        if r.finish_s is not None and r.ttft_s is not None and r.ttft_s * 1e3 <= slo.ttft_ms
        and (r.tpot_s is None or r.tpot_s * 1e3 <= slo.tpot_ms)
    )
    finished = sum(1 for r in records if r.finish_s is not None)
    return {"goodput": good / duration_s, "sloAttainment": good / total if total else math.nan,
            "finished": finished, "requests": total}


def engine_config(profile: str | Profile, ceiling: int, runtime: int, in_engine_tuner: bool = False,
                  policy: str = "GuaranteedNoEvict", backend: str = "tensorrt") -> EngineConfig:
    """A pod's kvsim configuration: the what-if's own (``whatif.sim_config``), so the simulated pods and the model
    of them are configured alike. On the PyTorch backend the in-engine batch tuner does not exist (kvsim refuses
    it, and kvpilot renders no dynamic_batch_config there), so ``in_engine_tuner`` is ignored."""
    return sim_config(profile, ceiling, runtime, policy, backend, in_engine_tuner)


def run_static(requests: list[Request], config: EngineConfig, replicas: int, slo: Slo, horizon_s: float,
               duration_s: float, queue_timeout_s: float | None = None) -> dict[str, float]:
    fleet = Fleet(config, replicas, restart_s=0.0, queue_timeout_s=queue_timeout_s, iteration_stats=False)
    for req in requests:
        fleet.advance(req.arrival_s)
        fleet.submit(req)
    fleet.advance(horizon_s)
    return goodput(fleet.records, len(requests), slo, duration_s)


def tuned_engine(profile: str, ceiling: int, slo: Slo, start: int, replicas: int,
                 policy: str = "GuaranteedNoEvict", autotune_max: int | None = None,
                 surge: bool = False, strategy: str | None = None,
                 in_engine_tuner: bool | None = None, backend: str = "tensorrt",
                 canary: str = "Off") -> InferenceEngine:
    """The InferenceEngine a user would apply: simulated backend, Auto mode, the SLOs, the product defaults.
    ``strategy``: the rollout strategy (default: Surge or NoSurge by ``surge``). ``in_engine_tuner``:
    ``batching.dynamicBatchSizeTuning`` (None: the schema's default)."""
    batching: dict[str, Any] = {"maxBatchSize": min(start, ceiling), "schedulerPolicy": policy}
    if in_engine_tuner is not None and backend != "pytorch":
        batching["dynamicBatchSizeTuning"] = in_engine_tuner
    manifest = {
        "apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine", "metadata": {"name": "bench"},
        "spec": {
            "model": {"source": "pvc://models/bench", "architecture": "llama"},
            "runtime": {"backend": "simulated", "simulation": {"profile": profile, "backend": backend}},
            "build": {"maxBatchSize": ceiling, "maxNumTokens": 8192},
            "batching": batching,
            "engineCache": {"claimName": "engines"},
            "serving": {"replicas": replicas, "rollout": {"strategy": strategy or ("Surge" if surge else "NoSurge")}},
            "autotune": {"mode": "Auto", "maxBatchSize": autotune_max or ceiling, "canary": canary,
                         "slo": {"timeToFirstTokenMillis": int(slo.ttft_ms), "timePerOutputTokenMillis": int(slo.tpot_ms)}},
        },
    }
    defaulted, errors = validate_manifest(manifest, spec_openapi())
    if errors:
        raise SystemExit("\n".join(str(e) for e in errors))
    return InferenceEngine(ObjectRef("bench", "bench", "uid", 1), parse_spec(defaulted["spec"]))


def run_autotuned(requests: list[Request], profile: str, ceiling: int, replicas: int, restart_s: float,
                  slo: Slo, horizon_s: float, duration_s: float, start: int = 64, policy: str = "GuaranteedNoEvict",
                  autotune_max: int | None = None, series: bool = False, surge: bool = False,
                  queue_timeout_s: float | None = None, spare_gpu: bool | None = None,
                  served: Profile | str | None = None, in_engine_tuner: bool = False,
                  backend: str = "tensorrt", canary: str = "Off") -> dict[str, Any]:
    """The operator's plan() in the loop of a simulated fleet. ``series``: also return one point per tuning
    interval (offered load, limit in force, KV utilization, p95 TTFT/TPOT, SLO attainment, decisions).
    ``spare_gpu``: when given, the engine's rollout strategy is ``Auto`` and the cluster reports this (free
    GPUs of the pods' product for every replica: the rollout surges them all at once); otherwise ``surge``
    picks Surge (one pod at a time) or NoSurge explicitly. ``served``: the engine the pods run (default: the
    ``profile`` the spec names; the tuner's what-if always simulates that named profile). ``in_engine_tuner``:
    the pods run TensorRT-LLM's in-engine batch-size tuner too. ``canary``: ``autotune.canary`` (Off, the product's
    default; Auto: a change the tuner proposes for a gain is tried on one pod first where the rollout cannot
    restart every pod at once; Always; bench/canary_fleet.py)."""
    engine_of = served if served is not None else profile
    if spare_gpu is not None:
        surge = spare_gpu
    room = (replicas if spare_gpu else 0) if spare_gpu is not None else None
    engine = tuned_engine(profile, ceiling, slo, start, replicas, policy, autotune_max, surge,
                          "Auto" if spare_gpu is not None else None, in_engine_tuner, backend, canary)
    interval = float(engine.spec.autotune.interval_seconds)
    status = EngineStatus()
    fingerprint = plan(engine, Observed(claim_phase="Bound"), Settings(), EPOCH).fingerprint
    index = {fingerprint: {"fingerprint": fingerprint, "maxBatchSize": ceiling, "maxNumTokens": 8192}}
    fleet = Fleet(engine_config(engine_of, ceiling, engine.spec.batching.max_batch_size, in_engine_tuner, policy, backend),
                  replicas, restart_s, surge=surge, queue_timeout_s=queue_timeout_s, max_surge=room or 1)
    canaries = CanaryFleet(fleet)
    points: list[dict[str, Any]] = []
    decision_cpu: list[float] = []
    planner = Planner(cpu_seconds_per_hour=math.inf)  # simulated time: no CPU budget
    arrived_before = gave_up_before = 0
    # Arrivals per sample period, at the live sampler's period and over its burstiness history (observe/scrape.py
    # count_arrivals); the bench counts the true arrivals, where the live sampler infers them from counters.
    period = sample_seconds(interval)
    arrival_times = [r.arrival_s for r in requests]
    counts: deque[float | None] = deque(maxlen=int(BURST_HISTORY_SECONDS / period))
    # The pods were Ready before the run began (the static runs charge no start-up either): a tuner switched
    # on for a serving Deployment reads warm pods from its first interval.
    ready_at = {r.name: -float(engine.spec.autotune.warmup_seconds) for r in fleet.replicas}
    next_tick, i, changes, history = interval, 0, 0, []
    in_force = engine.spec.batching.max_batch_size

    def config_of(value: int) -> EngineConfig:
        return engine_config(engine_of, ceiling, value, in_engine_tuner, policy, backend)
    verifications: list[dict[str, Any]] = []
    while True:
        t = min(requests[i].arrival_s if i < len(requests) else math.inf, next_tick, fleet.next_transition(),
                horizon_s)
        before = {r.name: r.state for r in fleet.replicas}
        fleet.advance(t)
        for r in fleet.replicas:
            if before.get(r.name) != "up" and r.state == "up":
                ready_at[r.name] = t
        if t >= horizon_s:
            break
        while i < len(requests) and requests[i].arrival_s <= t:
            fleet.submit(requests[i])
            i += 1
        if t >= next_tick:
            counts.extend(per_period(arrival_times, t - interval, t, period))
            next_tick += interval
            readings = PodReadings({}, {})
            drained = drain(fleet, t, engine.spec.autotune.warmup_seconds, ready_at, readings)
            window = window_of(drained, interval, slo, i - arrived_before, fleet.gave_up - gave_up_before,
                               list(counts))
            gave_up_before = fleet.gave_up
            observed = canaries.observe(Observed(status=status, claim_phase="Bound", engine_index=index, kv=window,
                                                 startup_seconds=restart_s, surge_room=room),
                                        drained, interval, slo, list(counts))
            started = time.process_time()
            # The operator's path: the engine fit takes the pods' samples, the planner checks the model and plans.
            # As the operator's loop: a canary pod's samples stay out of the fit (they run another limit).
            fit = canaries.without_canary(readings)
            planner.observe_pods(engine, fit.samples, fit.prompts, EPOCH.timestamp() + t,
                                 (status.batching or BatchingStatus()).max_batch_size or 0)
            p = planner.plan_inline(engine, _with_rollout(observed, fleet), Settings(), EPOCH + timedelta(seconds=t))
            decision_cpu.append(time.process_time() - started)
            status = p.status
            batching = status.batching or BatchingStatus()
            want = batching.max_batch_size
            assert want is not None, "the plan always says which max_batch_size is in force"
            # A canary runs, or started or ended: the fleet follows it; otherwise it rolls to the value in force.
            if not canaries.follow(status, want, config_of, t) and _target(fleet) != want:
                fleet.roll_to(config_of(want))
            if want != in_force:
                changes += 1
                history.append({"atSeconds": round(t), "to": want, "reason": batching.reason,
                                "rollback": batching.reason == "AutotuneRolledBack",
                                "message": (p.decision.message if p.decision is not None and p.decision.changes
                                            else batching.message or "")[:600]})
                in_force = want
            verdict = _verdict(status, verifications)
            if verdict is not None:
                verifications.append({"atSeconds": round(t), **verdict})
            if series:
                points.append(_point(t, interval, i - arrived_before, _target(fleet), window, slo, fleet))
            arrived_before = i
    planner.close()
    result: dict[str, Any] = {**goodput(fleet.records, len(requests), slo, duration_s)}
    result.update({"changes": changes, "final": _target(fleet), "history": history, "verifications": verifications,
                   "canaries": canaries.runs,
                   "restarts": sum(r.restarts for r in fleet.replicas),
                   "decisionCpuMs": {"mean": 1e3 * sum(decision_cpu) / max(1, len(decision_cpu)),
                                     "max": 1e3 * max(decision_cpu, default=0.0), "decisions": len(decision_cpu)}})
    if series:
        result["series"] = points
    return result


def _verdict(status: EngineStatus, seen: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A verification verdict the plan reached this interval (status.autotune.verification), once."""
    # getattr: the bench also drives a tuner from before verification existed (the suite's "before" figures).
    v = getattr(status.autotune, "verification", None) if status.autotune is not None else None
    if v is None or v.decided_at is None or (seen and seen[-1]["decidedAt"] == v.decided_at):
        return None
    return {"decidedAt": v.decided_at, "outcome": v.outcome, "reason": v.reason, "message": (v.message or "")[:600]}


def _point(t: float, interval: float, arrivals: int, limit: int, w: KvWindow | None, slo: Slo,
           fleet: Fleet | None = None) -> dict[str, Any]:
    """One time-series point of a tuned run (what the docs' plots show). ``limit`` is the target the plan
    set; ``inForce`` the max_batch_size the serving pods run now (lags the target while a rollout rolls)
    and ``active`` the fleet's mean batch (requests fetched into the batch per warm pod, from the window)."""
    met = None
    if w is not None and w.ttft_miss_fraction is not None:
        met = max(0.0, 1.0 - w.ttft_miss_fraction - (w.tpot_miss_fraction or 0.0))
    return {"t": round(t), "offered": arrivals / interval, "limit": limit,
            "kv": None if w is None else w.peak_utilization, "ttftP95": None if w is None else w.ttft_p95_ms,
            "tpotP95": None if w is None else w.tpot_p95_ms, "attainment": met,
            "inForce": None if fleet is None else sorted(r.config.max_batch_size or 0 for r in fleet.replicas
                                                         if r.state == "up"),
            "active": None if w is None else w.mean_active}


def _target(fleet: Fleet) -> int:
    """The limit the fleet is rolling to (or runs): an old pod draining out of a surge rollout does not count."""
    return max((r.next_config or r.config).max_batch_size or 0 for r in fleet.replicas if not r.retire)


def _with_rollout(observed: Observed, fleet: Fleet) -> Observed:
    """A rollout in progress shows as a Deployment whose updated replicas lag (the tuner then holds)."""
    n = len(fleet.replicas)
    updated = n - sum(1 for r in fleet.replicas if r.next_config is not None or r.state != "up")
    dep = DeploymentState(1, 1, n, updated, updated, updated, False, None, None, None)
    return replace(observed, deployment=dep) if fleet.rolling() else observed


def main(args: argparse.Namespace) -> int:
    out = evaluate(args)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of one benchmark; progress goes to stderr when ``args.json`` (stdout stays JSON)."""
    workload = load_workload(args.workload)
    requests = workload.requests(duration_s=args.duration_seconds, rate_scale=args.rate_scale)
    duration = args.duration_seconds or workload.duration_s
    horizon = duration + 120.0  # let the tail finish; goodput is over the workload's duration
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    # The same gateway as the suite's (docs/tuner-suite.md, "queue model"): a request not scheduled within
    # SHED_SHARE of the TTFT objective is shed, so no run collapses into serving clients that already left.
    shed = SHED_SHARE * slo.ttft_ms / 1e3
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    log(f"workload {workload.name}: {len(requests)} requests over {duration:.0f}s; profile {args.profile}; "
        f"{args.replicas} replicas; restart {args.restart_seconds:.0f}s")
    out: dict[str, Any] = {"workload": workload.name, "profile": args.profile, "replicas": args.replicas,
                           "slo": {"ttftMs": slo.ttft_ms, "tpotMs": slo.tpot_ms}}
    out["seedDefault"] = {"maxBatchSize": 64, **run_static(requests, engine_config(args.profile, 64, 64),
                                                           args.replicas, slo, horizon, duration, shed)}
    log(f"  seedDefault (static 64): goodput {out['seedDefault']['goodput']:.3f} req/s")
    out["trtllmDefault"] = {"maxBatchSize": 2048, **run_static(
        requests, engine_config(args.profile, 2048, 2048, in_engine_tuner=True), args.replicas, slo, horizon, duration,
        shed)}
    log(f"  trtllmDefault (2048 + in-engine tuner): goodput {out['trtllmDefault']['goodput']:.3f} req/s")
    sweep = {}
    for mbs in SWEEP:
        sweep[mbs] = run_static(requests, engine_config(args.profile, mbs, mbs), args.replicas, slo, horizon,
                                duration, shed)
        log(f"  static {mbs:5d}: goodput {sweep[mbs]['goodput']:.3f} req/s")
    best = max(sweep, key=lambda m: (sweep[m]["goodput"], -m))
    out["oracle"] = {"maxBatchSize": best, **sweep[best]}
    out["sweep"] = {str(k): v["goodput"] for k, v in sweep.items()}
    out["autotuned"] = run_autotuned(requests, args.profile, args.ceiling, args.replicas, args.restart_seconds,
                                     slo, horizon, duration, queue_timeout_s=shed)
    a, o, s = out["autotuned"]["goodput"], out["oracle"]["goodput"], out["seedDefault"]["goodput"]
    out["ratios"] = {"autotunedOverOracle": a / o if o else math.nan, "autotunedOverSeed": a / s if s else math.nan,
                     "oracleOverSeed": o / s if s else math.nan}
    log(f"  autotuned: goodput {a:.3f} req/s, {out['autotuned']['changes']} changes, final "
        f"{out['autotuned']['final']}; autotuned/oracle {out['ratios']['autotunedOverOracle']:.3f}, "
        f"autotuned/static64 {out['ratios']['autotunedOverSeed']:.3f}")
    return out
