"""Benchmark: the what-if's engine fit (autotune/calibrate.py) on engines that are not their kvsim profile.

Per suite case (operator/kvpilot/bench/suite.py) and per perturbed engine (each calibrated parameter and the
GPU memory x0.7 and x1.3, alone, and combined), a fleet of the case's replicas serves the case's traffic at the
limit in force (the suite's start, 64) for 10 minutes on the PERTURBED engine; every 15 s each pod's drained
``/metrics`` is parsed by the operator's own parser and fed to the fit, which starts from the NOMINAL profile.
Then the next 5 minutes of the case's traffic (held out) are served at that limit by the true engine, the
nominal profile and the fitted one (``engine_model.calibrated_profile``); the table gives each model's error on
the mean iteration latency and on goodput, before fitting (nominal) and after; also at 4x the limit (the
what-if's extrapolation), the fit's own live error (what status shows) and its CPU per window.

``--template``: the engine has no kvsim profile; the fit starts from the template kvsim would use (nearest
model size on the template GPU). ``--pytorch``: the pods report what the PyTorch backend does (no
``inflightBatchingStats``; the window's prompt tokens from the request counters).

Run: nice python -m tests.bench.bench_calibration_fit [--case NAME ...] [--all] [--template] [--pytorch] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from kvsim import Profile, Request, get_profile
from kvsim.specs import GPUS

from kvpilot.autotune.calibrate import EngineFit, PromptWork
from kvpilot.autotune.engine_model import TEMPLATE_GPU, calibrated_profile, BaseModel
from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.whatif import sim_config
from kvpilot.bench.suite import CASES, CEILING, START, Case
from kvpilot.trtllm.metrics import IterationSample, parse_iteration_stats

FIT_SECONDS = 600.0
EVAL_SECONDS = 300.0
EVAL_WARMUP = 60.0
INTERVAL = 15.0
DEFAULT_CASES = ("long-output-a100", "tight-tpot-overload", "long-output-l40s", "longctx-maxutil-l4",
                 "70b-tp2-steady", "chat-then-rag-a100")
CAL_FIELDS = ("hbm_efficiency", "prefill_mfu", "step_overhead_s", "per_sequence_s")


@dataclass(frozen=True)
class Perturbation:
    name: str
    factors: tuple[tuple[str, float], ...]  # Calibration field (or "memory") -> multiplier

    def apply(self, profile: Profile) -> Profile:
        cal, gpu = profile.calibration, profile.gpu
        for field, factor in self.factors:
            if field == "memory":
                gpu = replace(gpu, memory_bytes=int(gpu.memory_bytes * factor))
            else:
                cal = replace(cal, **{field: getattr(cal, field) * factor})
        return replace(profile, calibration=cal, gpu=gpu)


def perturbations() -> list[Perturbation]:
    short = {"hbm_efficiency": "hbm", "prefill_mfu": "mfu", "step_overhead_s": "step", "per_sequence_s": "perseq",
             "memory": "mem"}
    out = [Perturbation("nominal", ())]
    for field in (*CAL_FIELDS, "memory"):
        for factor in (0.7, 1.3):
            out.append(Perturbation(f"{short[field]}x{factor}", ((field, factor),)))
    out.append(Perturbation("issue18-slow", (("hbm_efficiency", 0.8), ("per_sequence_s", 1.5))))
    out.append(Perturbation("all-slow", (("hbm_efficiency", 0.7), ("prefill_mfu", 0.7), ("step_overhead_s", 1.3),
                                         ("per_sequence_s", 1.3), ("memory", 0.8))))
    out.append(Perturbation("all-fast", (("hbm_efficiency", 1.3), ("prefill_mfu", 1.3), ("step_overhead_s", 0.7),
                                         ("per_sequence_s", 0.7), ("memory", 1.2))))
    return out


def _config(case: Case, profile: Profile, limit: int) -> Any:
    return sim_config(profile, CEILING, limit, case.policy)


def _pytorch_shaped(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the PyTorch backend reports: an empty inflightBatchingStats, batch-size fields 0."""
    return [{**s, "inflightBatchingStats": {}, "maxBatchSizeRuntime": 0, "maxBatchSizeStatic": 0} for s in stats]


def feed_fit(case: Case, engine: Profile, fit: EngineFit, requests: list[Request], pytorch: bool) -> list[float]:
    """Serve ``requests`` at START on ``engine``, feeding the fit every INTERVAL; returns the CPU of each window."""
    fleet = Fleet(_config(case, engine, START), case.replicas, 0.0, queue_timeout_s=case.queue_timeout_s)
    cpu: list[float] = []
    i, t = 0, INTERVAL
    while t <= FIT_SECONDS + 1e-9:
        while i < len(requests) and requests[i].arrival_s <= t:
            fleet.advance(requests[i].arrival_s)
            fleet.submit(requests[i])
            i += 1
        fleet.advance(t)
        by_pod: dict[str, list[IterationSample]] = {}
        context: dict[str, PromptWork] = {}
        for r in fleet.replicas:
            stats = r.engine.drain_iteration_stats()
            by_pod[r.name] = parse_iteration_stats(_pytorch_shaped(stats) if pytorch else stats, t)
            done = r.engine.pop_finished()
            context[r.name] = PromptWork(float(sum(x.prompt_tokens for x in done)), float(len(done)))
        started = time.process_time()
        fit.observe(by_pod, t, START, context if pytorch else None)
        cpu.append(time.process_time() - started)
        t += INTERVAL
    return cpu


def serve(case: Case, profile: Profile, limit: int, requests: list[Request]) -> tuple[float, float]:
    """Goodput (req/s, after the warm-up) and mean iteration latency (ms, iteration-weighted) of ``requests``."""
    fleet = Fleet(_config(case, profile, limit), case.replicas, 0.0, queue_timeout_s=case.queue_timeout_s)
    busy = iterations = 0.0
    last: dict[str, int] = {}
    t = 0.0
    i = 0
    while t < EVAL_SECONDS + 60.0:
        t += 5.0
        while i < len(requests) and requests[i].arrival_s <= t:
            fleet.advance(requests[i].arrival_s)
            fleet.submit(requests[i])
            i += 1
        fleet.advance(t)
        for r in fleet.replicas:
            for s in r.engine.drain_iteration_stats():
                prev = last.get(r.name)
                k = s["iter"] - prev if prev is not None and s["iter"] > prev else 1
                last[r.name] = s["iter"]
                if t > EVAL_WARMUP:
                    busy += k * s["iterLatencyMS"]
                    iterations += k
    good = sum(1 for r in fleet.records if EVAL_WARMUP <= r.arrival_s < EVAL_SECONDS and r.finish_s is not None
               and r.ttft_s is not None and r.ttft_s * 1e3 <= case.ttft_ms
               and (r.tpot_s is None or r.tpot_s * 1e3 <= case.tpot_ms))
    return good / (EVAL_SECONDS - EVAL_WARMUP), busy / iterations if iterations else math.nan


def _err(model: float, true: float) -> float:
    return model / true - 1.0 if true > 0 and math.isfinite(model) else (0.0 if model == true else math.inf)


def template_for(profile: Profile) -> Profile:
    """What base_model gives an engine kvsim has no profile of: the same-size model on the template GPU."""
    return replace(profile, name=profile.name + "-template", gpu=GPUS[TEMPLATE_GPU]) \
        if profile.gpu.name != TEMPLATE_GPU else replace(profile, name=profile.name + "-template", gpu=GPUS["a100"])


def run(case: Case, pert: Perturbation, template: bool, pytorch: bool) -> dict[str, Any]:
    nominal = get_profile(case.profile)
    engine = pert.apply(nominal)
    start = template_for(nominal) if template else nominal
    base = BaseModel(start, not template, "bench")
    requests = case.requests()
    fit = EngineFit(start, known=not template)
    cpu = feed_fit(case, engine, fit, [r for r in requests if r.arrival_s < FIT_SECONDS], pytorch)
    result = fit.result()
    started = time.process_time()
    fitted = calibrated_profile(base, result, CEILING, case.policy)
    profile_cpu = time.process_time() - started
    held = [replace(r, arrival_s=r.arrival_s - FIT_SECONDS) for r in requests
            if FIT_SECONDS <= r.arrival_s < FIT_SECONDS + EVAL_SECONDS]
    row: dict[str, Any] = {"case": case.name, "engine": pert.name, "template": template, "pytorch": pytorch,
                           "liveError": result.latency_error, "liveNominalError": result.nominal_error,
                           "fitCpuMsMean": 1e3 * sum(cpu) / len(cpu), "fitCpuMsMax": 1e3 * max(cpu),
                           "profileCpuMs": 1e3 * profile_cpu, "fitted": result.calibration.__dict__,
                           "weightsScale": result.weights_scale}
    for label, limit in (("limit", START), ("x4", START * 4)):
        g_true, l_true = serve(case, engine, limit, held)
        g_nom, l_nom = serve(case, start, limit, held)
        g_fit, l_fit = serve(case, fitted, limit, held)
        row[label] = {"goodput": g_true, "latencyMs": l_true,
                      "before": {"latency": _err(l_nom, l_true), "goodput": _err(g_nom, g_true)},
                      "after": {"latency": _err(l_fit, l_true), "goodput": _err(g_fit, g_true)}}
    return row


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | engine | goodput | iter ms | latency before | latency after | goodput before | goodput after "
            "| 4x: latency after | 4x: goodput after | live error | fit CPU ms/window |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        a, b = r["limit"], r["x4"]
        lines.append(f"| {r['case']} | {r['engine']} | {a['goodput']:.2f} | {a['latencyMs']:.2f} | "
                     f"{_pct(a['before']['latency'])} | {_pct(a['after']['latency'])} | {_pct(a['before']['goodput'])} | "
                     f"{_pct(a['after']['goodput'])} | {_pct(b['after']['latency'])} | {_pct(b['after']['goodput'])} | "
                     f"{_pct(r['liveError'])} | {r['fitCpuMsMean']:.1f} (max {r['fitCpuMsMax']:.1f}) |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    worst = {k: max(abs(r["limit"]["after"][k]) for r in rows) for k in ("latency", "goodput")}
    before = {k: max(abs(r["limit"]["before"][k]) for r in rows) for k in ("latency", "goodput")}
    x4 = {k: max(abs(r["x4"]["after"][k]) for r in rows) for k in ("latency", "goodput")}
    within = sum(1 for r in rows if abs(r["limit"]["after"]["latency"]) <= 0.05 and abs(r["limit"]["after"]["goodput"]) <= 0.05)
    cpu = sum(r["fitCpuMsMean"] for r in rows) / len(rows)
    return (f"{len(rows)} engines: worst |error| at the limit before fitting {100 * before['latency']:.1f}% latency, "
            f"{100 * before['goodput']:.1f}% goodput; after {100 * worst['latency']:.1f}% latency, "
            f"{100 * worst['goodput']:.1f}% goodput ({within}/{len(rows)} within 5% on both); at 4x the limit after "
            f"{100 * x4['latency']:.1f}% latency, {100 * x4['goodput']:.1f}% goodput; fit CPU {cpu:.1f} ms per window (mean)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_calibration_fit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help="a suite case (repeatable; default: six where the knob matters)")
    parser.add_argument("--all", action="store_true", help="every suite case")
    parser.add_argument("--engine", action="append", help="a perturbation by name (repeatable; default: all)")
    parser.add_argument("--template", action="store_true", help="fit from the template (no kvsim profile)")
    parser.add_argument("--pytorch", action="store_true", help="the pods report what the PyTorch backend does")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON after the table")
    args = parser.parse_args(argv if argv is not None else [])
    names = [c.name for c in CASES] if args.all else (args.case or list(DEFAULT_CASES))
    cases = [c for c in CASES if c.name in names]
    perts = [p for p in perturbations() if not args.engine or p.name in args.engine]
    rows = []
    for case in cases:
        for pert in perts:
            rows.append(run(case, pert, args.template, args.pytorch))
            print(f"{case.name} {pert.name}: {_pct(rows[-1]['limit']['after']['latency'])} latency, "
                  f"{_pct(rows[-1]['limit']['after']['goodput'])} goodput after fitting", file=sys.stderr, flush=True)
    print(table(rows))
    print(summary(rows))
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
