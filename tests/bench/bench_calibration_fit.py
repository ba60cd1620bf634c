"""Benchmark: the what-if's engine fit (autotune/calibrate.py) on engines that are not their kvsim profile.

Per suite case (operator/kvpilot/bench/suite.py) and per perturbed engine (each calibrated parameter and the
GPU memory x0.7 and x1.3, alone, and combined), a fleet of the case's replicas serves the case's traffic at the
limit in force (the suite's start, 64) for 10 minutes on the PERTURBED engine; every 15 s each pod's drained
``/metrics`` is parsed by the operator's own parser and fed to the fit, which starts from the NOMINAL profile.
Then the case's next traffic (held out: at least 5 minutes and 3,000 requests, at most the rest of the case)
is served at that limit by the true engine, the nominal profile and the fitted one (``engine_model.calibrated_profile``); the table gives each model's error on
the mean iteration latency and on goodput, before fitting (nominal) and after; also at 4x the limit (the
what-if's extrapolation), the fit's own live error (what status shows) and its CPU per window.

``--template``: the engine has no kvsim profile; the fit starts from the template kvsim would use (nearest
model size on the template GPU). ``--pytorch``: the pods run kvsim's PyTorch backend (its memory plan) and
report no ``inflightBatchingStats`` (the fit's fallback: the window's prompt tokens from the request counters).

Run: nice python -m tests.bench.bench_calibration_fit [--case NAME ...] [--all] [--template] [--pytorch] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from typing import Any

from kvsim import Profile, Request, get_profile
from kvsim.perturb import Perturbation
from kvsim.specs import GPUS

from kvpilot.autotune.calibrate import EngineFit, PromptWork
from kvpilot.autotune.engine_model import TEMPLATE_GPU, calibrated_profile, BaseModel
from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.trust import MODEL_ERROR_BOUND
from kvpilot.autotune.whatif import sim_config
from kvpilot.bench.suite import CASES, CEILING, START, Case
from kvpilot.trtllm.metrics import IterationSample, parse_iteration_stats

FIT_SECONDS = 600.0
EVAL_MIN_SECONDS = 300.0  # held out: at least this long, and long enough for EVAL_REQUESTS (the rest of the case at most)
EVAL_REQUESTS = 3000
EVAL_WARMUP = 60.0
INTERVAL = 15.0
DEFAULT_CASES = ("long-output-a100", "tight-tpot-overload", "long-output-l40s", "longctx-maxutil-l4",
                 "70b-tp2-steady", "chat-then-rag-a100")


# The suite's perturbed engines (issue 18: each calibrated parameter both ways within kvsim's measured error,
# memory within 20%, combined, and the issue's own example; the same set as verify's bench/perturb.py), plus the
# combinations at the full 30% both ways.
PERTURBATIONS: dict[str, Perturbation] = {
    "nominal": Perturbation(),
    "decode0.7": Perturbation(decode=0.7), "decode1.3": Perturbation(decode=1.3),
    "prefill0.7": Perturbation(prefill=0.7), "prefill1.3": Perturbation(prefill=1.3),
    "overhead0.7": Perturbation(overhead=0.7), "overhead1.3": Perturbation(overhead=1.3),
    "perseq0.7": Perturbation(per_seq=0.7), "perseq1.3": Perturbation(per_seq=1.3),
    "memory0.8": Perturbation(memory=0.8), "memory1.2": Perturbation(memory=1.2),
    "memory0.7": Perturbation(memory=0.7), "memory1.3": Perturbation(memory=1.3),
    "decode0.8-perseq1.5": Perturbation(decode=0.8, per_seq=1.5),
    "all-slow": Perturbation(decode=0.8, prefill=0.8, overhead=1.25, per_seq=1.25, memory=0.9),
    "all-fast": Perturbation(decode=1.2, prefill=1.2, overhead=0.8, per_seq=0.8, memory=1.1),
    "all-slow-30": Perturbation(decode=0.7, prefill=0.7, overhead=1.3, per_seq=1.3, memory=0.8),
    "all-fast-30": Perturbation(decode=1.3, prefill=1.3, overhead=0.7, per_seq=0.7, memory=1.2),
}


BACKEND = {"value": "tensorrt"}  # --pytorch: the pods run kvsim's PyTorch backend


def _config(case: Case, profile: Profile, limit: int) -> Any:
    return sim_config(profile, CEILING, limit, case.policy, BACKEND["value"])


def _pytorch_shaped(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PyTorch backend's stats as shared/reference/trtllm-forward.md section 2 reads PyExecutor: an empty
    inflightBatchingStats (kvsim's PyTorch backend fills it, from a later reading; the fit's fallback is for
    the empty one), batch-size fields 0."""
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


def serve(case: Case, profile: Profile, limit: int, requests: list[Request], seconds: float) -> tuple[float, float]:
    """Goodput (req/s, after the warm-up) and mean iteration latency (ms, iteration-weighted) of ``requests``."""
    fleet = Fleet(_config(case, profile, limit), case.replicas, 0.0, queue_timeout_s=case.queue_timeout_s)
    busy = iterations = 0.0
    last: dict[str, int] = {}
    t = 0.0
    i = 0
    while t < seconds + 60.0:
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
    good = sum(1 for r in fleet.records if EVAL_WARMUP <= r.arrival_s < seconds and r.finish_s is not None
               and r.ttft_s is not None and r.ttft_s * 1e3 <= case.ttft_ms
               and (r.tpot_s is None or r.tpot_s * 1e3 <= case.tpot_ms))
    return good / (seconds - EVAL_WARMUP), busy / iterations if iterations else math.nan


def _err(model: float, true: float) -> float:
    return model / true - 1.0 if true > 0 and math.isfinite(model) else (0.0 if model == true else math.inf)


def template_for(profile: Profile) -> Profile:
    """What base_model gives an engine kvsim has no profile of: the same-size model on the template GPU."""
    return replace(profile, name=profile.name + "-template", gpu=GPUS[TEMPLATE_GPU]) \
        if profile.gpu.name != TEMPLATE_GPU else replace(profile, name=profile.name + "-template", gpu=GPUS["a100"])


def run(case: Case, name: str, template: bool, pytorch: bool) -> dict[str, Any]:
    pert = PERTURBATIONS[name]
    nominal = get_profile(case.profile)
    engine = pert.apply(nominal)
    start = template_for(nominal) if template else nominal
    base = BaseModel(start, not template, "bench")
    requests = case.requests()
    fit = EngineFit(start, known=not template)
    cpu = feed_fit(case, engine, fit, [r for r in requests if r.arrival_s < FIT_SECONDS], pytorch)
    result = fit.result()
    started = time.process_time()
    fitted = calibrated_profile(base, result, CEILING, case.policy, BACKEND["value"])
    profile_cpu = time.process_time() - started
    rest = [r for r in requests if r.arrival_s >= FIT_SECONDS]
    rate = len(rest) / max(1.0, case.duration_s - FIT_SECONDS)
    seconds = min(case.duration_s - FIT_SECONDS, max(EVAL_MIN_SECONDS, EVAL_WARMUP + EVAL_REQUESTS / max(rate, 1e-9)))
    held = [replace(r, arrival_s=r.arrival_s - FIT_SECONDS) for r in rest if r.arrival_s < FIT_SECONDS + seconds]
    offered = sum(1 for r in held if r.arrival_s >= EVAL_WARMUP) / (seconds - EVAL_WARMUP)
    row: dict[str, Any] = {"case": case.name, "engine": name, "perturbation": pert.to_text(), "template": template, "pytorch": pytorch,
                           "liveError": result.latency_error, "liveNominalError": result.nominal_error,
                           "fitCpuMsMean": 1e3 * sum(cpu) / len(cpu), "fitCpuMsMax": 1e3 * max(cpu),
                           "profileCpuMs": 1e3 * profile_cpu, "fitted": result.calibration.__dict__,
                           "weightsScale": result.weights_scale}
    for label, limit in (("limit", START), ("x4", START * 4)):
        g_true, l_true = serve(case, engine, limit, held, seconds)
        g_nom, l_nom = serve(case, start, limit, held, seconds)
        g_fit, l_fit = serve(case, fitted, limit, held, seconds)
        row[label] = {"goodput": g_true, "offered": offered, "latencyMs": l_true, "evalSeconds": seconds,
                      "before": {"latency": _err(l_nom, l_true), "goodput": _err(g_nom, g_true),
                                 "goodputOfOffered": (g_nom - g_true) / offered},
                      "after": {"latency": _err(l_fit, l_true), "goodput": _err(g_fit, g_true),
                                "goodputOfOffered": (g_fit - g_true) / offered}}
    return row


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | engine | goodput / offered | iter ms | latency before | latency after | goodput before | "
            "goodput after (of offered) | 4x: latency after | 4x: goodput after | live error | trust | "
            "fit CPU ms/window |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        a, b = r["limit"], r["x4"]
        lines.append(f"| {r['case']} | {r['engine']} | {a['goodput']:.2f} / {a['offered']:.2f} | {a['latencyMs']:.2f} | "
                     f"{_pct(a['before']['latency'])} | {_pct(a['after']['latency'])} | {_pct(a['before']['goodput'])} | "
                     f"{_pct(a['after']['goodput'])} ({_pct(a['after']['goodputOfOffered'])}) | "
                     f"{_pct(b['after']['latency'])} | {_pct(b['after']['goodput'])} | "
                     f"{_pct(r['liveError'])} | {_trust(r)} | {r['fitCpuMsMean']:.1f} (max {r['fitCpuMsMax']:.1f}) |")
    return "\n".join(lines)


def _trust(row: dict[str, Any]) -> str:
    """What the tuner's model check would say (autotune/trust.py): the fit's live latency error and the goodput
    error at the limit, as a share of the offered traffic, against the bound."""
    worst = max(row["liveError"] or 0.0, abs(row["limit"]["after"]["goodputOfOffered"]))
    return "Trusted" if worst <= MODEL_ERROR_BOUND else "Distrusted"


def summary(rows: list[dict[str, Any]]) -> str:
    worst = {k: max(abs(r["limit"]["after"][k]) for r in rows) for k in ("latency", "goodput")}
    before = {k: max(abs(r["limit"]["before"][k]) for r in rows) for k in ("latency", "goodput")}
    x4 = {k: max(abs(r["x4"]["after"][k]) for r in rows) for k in ("latency", "goodput")}
    within = sum(1 for r in rows if abs(r["limit"]["after"]["latency"]) <= 0.05 and abs(r["limit"]["after"]["goodput"]) <= 0.05)
    offered = max(abs(r["limit"]["after"]["goodputOfOffered"]) for r in rows)
    cpu = sum(r["fitCpuMsMean"] for r in rows) / len(rows)
    distrusted = [r for r in rows if _trust(r) == "Distrusted"]
    missed = sum(1 for r in rows if _trust(r) == "Trusted" and max(abs(r["limit"]["after"]["latency"]),
                                                                   abs(r["limit"]["after"]["goodputOfOffered"])) > 0.05)
    return (f"{len(rows)} engines: worst |error| at the limit before fitting {100 * before['latency']:.1f}% latency, "
            f"{100 * before['goodput']:.1f}% goodput; after {100 * worst['latency']:.1f}% latency, "
            f"{100 * worst['goodput']:.1f}% goodput, {100 * offered:.1f}% of the offered traffic ({within}/{len(rows)} "
            f"within 5% on both); at 4x the limit after "
            f"{100 * x4['latency']:.1f}% latency, {100 * x4['goodput']:.1f}% goodput; {len(distrusted)} distrusted by the "
            f"model check, {missed} trusted while more than 5% off; fit CPU {cpu:.1f} ms per window (mean)")


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
    BACKEND["value"] = "pytorch" if args.pytorch else "tensorrt"
    names = [c.name for c in CASES] if args.all else (args.case or list(DEFAULT_CASES))
    cases = [c for c in CASES if c.name in names]
    unknown = sorted(set(args.engine or ()) - set(PERTURBATIONS))
    if unknown:
        parser.error(f"--engine: unknown {', '.join(unknown)}; engines: {', '.join(PERTURBATIONS)}")
    perts = [p for p in PERTURBATIONS if not args.engine or p in args.engine]
    rows = []
    for case in cases:
        for pert in perts:
            rows.append(run(case, pert, args.template, args.pytorch))
            print(f"{case.name} {pert}: {_pct(rows[-1]['limit']['after']['latency'])} latency, "
                  f"{_pct(rows[-1]['limit']['after']['goodput'])} goodput after fitting", file=sys.stderr, flush=True)
    print(table(rows))
    print(summary(rows))
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
