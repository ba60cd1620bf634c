"""``kvpilot bench tuner --suite``: the autotuner against doing nothing, the best static value, hindsight and the peer.

Each row is a case (``bench/cases.py``: a workload on a profile with SLOs) on a served engine: the nominal profile,
or a perturbed one whose what-if still starts from the nominal profile (``bench/perturb.py``, issue 18). Per row the
suite runs the static sweep (every value in ``SWEEP``, with no restart), takes the oracle static (the best of the
sweep), builds the hindsight-best schedule (the best static value of each phase, one change at each phase
boundary, paying the rolling restart; never worse than the oracle, which is the schedule that never changes), runs
TensorRT-LLM's default (static 2048 with its in-engine batch-size tuner: the peer a user would pick instead), and
runs the operator's tuner in the loop (``run_autotuned``) from 64 and from 2048. The cases cover where the knob does
not matter as well as where it does, and the table says which is which.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any, Callable

from kvsim import Request

from kvpilot.bench.cases import CASES, Case
from kvpilot.bench.perturb import PERTURBATIONS, perturbation_named, served_profile
from kvpilot.bench.report import criteria, missed_by_instant, summary_line, table
from kvpilot.bench.runs import (CEILING, START, SWEEP, TRTLLM_DEFAULT, Served, cannot_start, phase_best,
                                phase_goodput, reactive_changes, run_changes, run_static_records, schedule_changes)
from kvpilot.bench.tuner import run_autotuned

# The tuned runs: (name in the row, start, engine ceiling = the tuner's upper bound, in-engine tuner on). From 64 the
# engine is built for the suite's 1024 ceiling, as in every earlier revision; from TensorRT-LLM's default the
# engine is that default (2048 with its in-engine tuner, which kvpilot's schema also leaves on), and kvpilot may
# move anywhere up to it.
TUNED_RUNS: tuple[tuple[str, int, int, bool], ...] = (
    ("autotuned", START, CEILING, False),
    ("autotunedFrom2048", TRTLLM_DEFAULT, TRTLLM_DEFAULT, True),
)


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _bounds(requests: list[Request], served: Served, sweep: dict[int, float], per_phase: dict[int, list[int]],
            horizon: float) -> dict[str, Any]:
    """Hindsight, the reactive bound and the instant reference of one row."""
    case = served.case
    oracle = max(sweep, key=lambda m: (sweep[m], -abs(math.log(m / START))))
    phases = len(case.boundaries) + 1
    hindsight: dict[str, Any] = {"schedule": [oracle], "goodput": sweep[oracle]}
    if case.boundaries:
        def best_in(k: int) -> int:
            return max(SWEEP, key=lambda m: (per_phase[m][k], -abs(math.log(m / oracle))))

        schedule = [best_in(k) for k in range(phases)]
        if len(set(schedule)) > 1:
            scheduled = run_changes(requests, served, schedule[0], schedule_changes(schedule, case.boundaries),
                                    horizon)
            if scheduled["goodput"] > hindsight["goodput"]:
                hindsight = {"schedule": schedule, "goodput": scheduled["goodput"]}
    followed = phase_best(per_phase, phases)
    changes = reactive_changes(followed, case.boundaries)
    reactive: dict[str, Any] = {"changes": [[t, v] for t, v in changes],
                                "goodput": run_changes(requests, served, START, changes, horizon)["goodput"]
                                if changes else sweep[START]}
    # The same changes with no delay at all (the instant reference): a tuner that must not change a limit where
    # no value beats it (the property test) cannot act earlier; where even this schedule misses a
    # figure, the table says so (it is one schedule, not a proof over every tuner).
    at_once = reactive_changes(followed, case.boundaries, 0.0)
    instant = run_changes(requests, served, START, at_once, horizon)["goodput"] if at_once else sweep[START]
    return {"oracle": oracle, "hindsight": hindsight, "reactive": reactive, "instant": instant}


def _tuned(requests: list[Request], served: Served, start: int, ceiling: int, in_engine_tuner: bool,
           horizon: float, series: bool) -> dict[str, Any]:
    case = served.case
    return run_autotuned(requests, case.profile, ceiling, case.replicas, case.restart_s, served.slo, horizon,
                         case.duration_s, start=start, policy=case.policy, autotune_max=ceiling, series=series,
                         spare_gpu=case.spare_gpu, queue_timeout_s=case.queue_timeout_s,
                         served=served_profile(case.profile, served.perturbation),
                         in_engine_tuner=in_engine_tuner and case.backend != "pytorch", backend=case.backend,
                         canary=case.canary)


def false_rollbacks(tuned: dict[str, Any], start: int, steady: bool, static: Callable[[int], float]) -> int:
    """Rollbacks of a change that was not harmful, on a steady row (one phase, so a limit's static goodput says
    what it is worth over the whole run): the value rolled back from serves, held statically, at least 99% of
    what the value rolled back to serves. (On a row whose load changes, a rollback may be right for the moment
    and the static figures cannot judge it.)"""
    if not steady:
        return 0
    values = [start] + [h["to"] for h in tuned["history"]]
    return sum(1 for k, h in enumerate(tuned["history"])
               if h.get("rollback") and static(values[k]) >= 0.99 * static(values[k + 1]))


def row_name(case: Case, perturbation: str) -> str:
    """The row's name (it names the row's SVG file): the case, the perturbation unless nominal, and the backend
    unless TensorRT."""
    name = case.name if perturbation == "nominal" else f"{case.name}.{perturbation}"
    return name if case.backend == "tensorrt" else f"{name}.{case.backend}"


def tuner_free(requests: list[Request], served: Served, horizon: float) -> dict[str, Any]:
    """Everything in a row that does not depend on the tuner: the static sweep, TensorRT-LLM's default, the
    oracle, hindsight, the reactive bound and the instant reference (two thirds of a row's CPU)."""
    case = served.case
    sweep, per_phase = {}, {}
    edges = [0.0] + case.boundaries + [case.duration_s]
    for mbs in SWEEP:
        result, records = run_static_records(requests, served, served.config(mbs), horizon)
        sweep[mbs] = result["goodput"]
        per_phase[mbs] = [phase_goodput(records, case, edges[k], edges[k + 1]) for k in range(len(edges) - 1)]
    peer_config = served.config(TRTLLM_DEFAULT, TRTLLM_DEFAULT, True)
    down = cannot_start(peer_config)  # its pods would not start: it serves nothing
    peer = 0.0 if down else run_static_records(requests, served, peer_config, horizon)[0]["goodput"]
    return {"sweep": sweep, "peer": peer, "peerCannotStart": down, **_bounds(requests, served, sweep, per_phase, horizon)}


def reused(row: dict[str, Any]) -> dict[str, Any]:
    """A previous run's row (``kvpilot bench tuner --suite --json``) as ``tuner_free`` returns it."""
    try:
        return {"sweep": {int(k): float(v) for k, v in row["sweep"].items()}, "peer": float(row["trtllmDefault"]["goodput"]),
                "peerCannotStart": row["trtllmDefault"].get("cannotStart"),
                "oracle": int(row["oracle"]["maxBatchSize"]), "hindsight": dict(row["hindsight"]),
                "reactive": dict(row["reactive"]),
                "instant": float(row["ratios"]["instantOverOracle"]) * float(row["oracle"]["goodput"])}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SystemExit(f"kvpilot bench tuner --bounds: row {row.get('case')!r} lacks {exc}; give a suite JSON "
                         f"of this revision (kvpilot bench tuner --suite --json)") from None


def run_case(case: Case, series: bool = False, log: Callable[[str], object] = print,
             perturbation: str = "nominal", reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: ``case`` on the served engine ``perturbation`` names (``bench/perturb.py``). ``reuse``: the
    tuner-independent figures of this row from an earlier run (``reused``); only the tuned runs then run."""
    started = time.process_time()
    served = Served(case, perturbation_named(perturbation))
    requests = case.requests()
    horizon = case.duration_s + 120.0
    bounds = reuse if reuse is not None else tuner_free(requests, served, horizon)
    sweep = bounds["sweep"]
    peer = {"goodput": bounds["peer"]}
    down = bounds.get("peerCannotStart")
    # From 2048 the engine is TensorRT-LLM's default: where its pods cannot start, neither can that run.
    tuned = {key: _tuned(requests, served, start, ceiling, tuner, horizon, series)
             for key, start, ceiling, tuner in TUNED_RUNS if not (down and start == TRTLLM_DEFAULT)}
    for (key, start, ceiling, tuner) in TUNED_RUNS:
        if key not in tuned:
            continue
        def static(m: int, c: int = ceiling, t: bool = tuner) -> float:
            if m in sweep and not t:
                return float(sweep[m])
            return float(run_static_records(requests, served, served.config(m, c, t), horizon)[0]["goodput"])

        tuned[key]["falseRollbacks"] = false_rollbacks(tuned[key], start, case.steady, static)
    oracle = bounds["oracle"]
    a, o, s, h = tuned["autotuned"]["goodput"], sweep[oracle], sweep[START], bounds["hindsight"]["goodput"]
    p = peer["goodput"]
    run_2048 = tuned.get("autotunedFrom2048")
    from_2048 = {"from2048OverPeer": _ratio(run_2048["goodput"], p),
                 "from2048OverOracle": _ratio(run_2048["goodput"], o)} if run_2048 is not None else {}
    out = {
        "case": row_name(case, perturbation), "baseCase": case.name, "perturbation": perturbation,
        "perturbationFactors": served.perturbation.to_text(), "profile": case.profile, "covers": case.covers,
        "policy": case.policy, "spareGpu": case.spare_gpu, "backend": case.backend, "canary": case.canary,
        "requests": len(requests),
        "sweep": {str(k): v for k, v in sweep.items()},
        "oracle": {"maxBatchSize": oracle, "goodput": o}, "start": {"maxBatchSize": START, "goodput": s},
        "trtllmDefault": {"maxBatchSize": TRTLLM_DEFAULT, "inEngineTuner": case.backend != "pytorch", "goodput": p,
                          **({"cannotStart": down} if down else {})},
        "hindsight": bounds["hindsight"], "reactive": bounds["reactive"], **tuned,
        "ratios": {"overStart": _ratio(a, s), "overOracle": _ratio(a, o), "hindsightOverOracle": _ratio(h, o),
                   "overReactive": _ratio(a, bounds["reactive"]["goodput"]),
                   "instantOverOracle": _ratio(bounds["instant"], o), "overPeer": _ratio(a, p),
                   **from_2048, "peerOverStart": _ratio(p, s)},
        "knobMatters": (max(sweep.values()) - min(sweep.values())) > 0.03 * max(sweep.values()),
        "cpuSeconds": time.process_time() - started,
    }
    out["criteria"] = criteria(out, case)
    out["missedByInstant"] = missed_by_instant(out)
    log(f"{out['case']:34s} start {s:7.3f} oracle {o:7.3f}@{oracle:<4d} peer {p:7.3f} "
        f"tuned64 {a:7.3f} ({tuned['autotuned']['changes']} ch, final {tuned['autotuned']['final']}) "
        f"{_from_2048_text(tuned.get('autotunedFrom2048'))} ({out['cpuSeconds']:.0f} CPU-s)")
    return out


def _from_2048_text(run: dict[str, Any] | None) -> str:
    if run is None:
        return "tuned2048 n/a (TensorRT-LLM's default cannot start on this engine)"
    return f"tuned2048 {run['goodput']:7.3f} ({run['changes']} ch, final {run['final']})"


def _row_job(job: tuple[Case, str, bool, dict[str, Any] | None]) -> dict[str, Any]:
    case, perturbation, series, reuse = job
    return run_case(case, series=series, log=lambda msg: print(msg, file=sys.stderr, flush=True),
                    perturbation=perturbation, reuse=reuse)


def row_key(case: Case, perturbation: str) -> str:
    """What a row's tuner-independent figures depend on: the case, its served engine and the spare GPU."""
    return f"{row_name(case, perturbation)}|{'spare' if case.spare_gpu else 'full'}"


def _rows(path: str, flag: str) -> list[dict[str, Any]]:
    """The rows of a suite JSON, or of a ``--partial`` file of JSON lines; ``flag`` names the option in errors."""
    try:
        with open(path) as f:
            text = f.read()
        try:
            doc = json.loads(text)
        except ValueError:  # one row per line
            doc = {"cases": [json.loads(line) for line in text.splitlines() if line.strip()]}
    except (OSError, ValueError) as exc:
        raise SystemExit(f"kvpilot bench tuner {flag} {path}: {exc}") from None
    if isinstance(doc, dict) and "case" in doc:
        doc = {"cases": [doc]}  # a partial file of one row
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list) or \
            not all(isinstance(row, dict) for row in doc["cases"]):
        raise SystemExit(f"kvpilot bench tuner {flag} {path}: not a suite result (an object with 'cases')")
    return list(doc["cases"])


def _key_of(row: dict[str, Any]) -> str:
    """``row_key`` of a row read back from a file."""
    case = replace(next((c for c in CASES if c.name == row.get("baseCase", row.get("case"))), CASES[0]),
                   spare_gpu=bool(row.get("spareGpu", True)), backend=str(row.get("backend", "tensorrt")))
    return row_key(case, str(row.get("perturbation", "nominal")))


def load_bounds(path: str) -> dict[str, dict[str, Any]]:
    """The tuner-independent figures of every row of a suite JSON (or of a ``partial`` file of JSON lines)."""
    return {_key_of(row): reused(row) for row in _rows(path, "--bounds")}


def resumed(partial: str, canary: str) -> dict[str, dict[str, Any]]:
    """The rows a ``--partial`` file already holds for this tuner setting (``canary``), by ``row_key``, so a scan
    stopped part-way (a session's end) goes on where it stopped. A last line cut off mid-write (the process was
    killed) is dropped from the file, so the rows appended next start on a line of their own."""
    if not os.path.exists(partial):
        return {}
    with open(partial, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
    return {_key_of(row): row for row in _rows(partial, "--resume --partial") if row.get("canary", "Off") == canary}


def _kept(row: dict[str, Any], partial: str | None) -> dict[str, Any]:
    if partial:
        with open(partial, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def suite_jobs(only: list[str] | None, spare_gpu: bool, perturbations: list[str],
               backend: str = "tensorrt", canary: str = "Off") -> list[tuple[Case, str]]:
    """The rows to run: every case (or those in ``only``) on each served engine in ``perturbations``, its pods on
    ``backend``, the tuner's ``autotune.canary`` set to ``canary``."""
    unknown = sorted(set(only or ()) - {c.name for c in CASES})
    if unknown:
        raise SystemExit(f"kvpilot bench tuner --case: unknown case(s) {', '.join(unknown)}; "
                         f"cases: {', '.join(c.name for c in CASES)}")
    bad = sorted(set(perturbations) - {"nominal", *PERTURBATIONS})
    if bad:
        raise SystemExit(f"kvpilot bench tuner --perturbation: unknown perturbation(s) {', '.join(bad)}; "
                         f"perturbations: nominal, {', '.join(PERTURBATIONS)}")
    cases = [replace(c, spare_gpu=c.spare_gpu and spare_gpu, backend=backend, canary=canary) for c in CASES
             if not only or c.name in only]
    return [(c, p) for p in perturbations for c in cases]


def run_suite(as_json: bool, only: list[str] | None = None, series: bool = False, spare_gpu: bool = True,
              perturbations: list[str] | None = None, jobs: int = 1,
              bounds: dict[str, dict[str, Any]] | None = None, partial: str | None = None,
              backend: str = "tensorrt", canary: str = "Off", resume: bool = False) -> dict[str, Any]:
    """Every row (or those of the cases named in ``only``), on each served engine in ``perturbations`` (default:
    the nominal profile only). ``spare_gpu=False``: the same cases on a cluster with no free GPU, where every
    rollout drops a pod's capacity while it restarts. ``jobs``: rows run in that many processes at once (the
    figures do not depend on it; each row is deterministic). ``bounds``: tuner-independent figures to reuse, by
    ``row_key`` (``load_bounds``). ``partial``: a file each row is appended to (one JSON line) once it is done, so
    a long run that is stopped keeps what it measured; with ``resume`` the rows it holds are not run again."""
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if as_json else print
    work = suite_jobs(only, spare_gpu, perturbations or ["nominal"], backend, canary)
    started = time.perf_counter()
    cpu = time.process_time()
    keys = [row_key(c, p) for c, p in work]
    done = resumed(partial, canary) if resume and partial else {}
    if done:
        log(f"kvpilot bench tuner --resume: {sum(k in done for k in keys)} of {len(work)} rows already in {partial}")
    jobs_in = [(c, p, series, (bounds or {}).get(k)) for (c, p), k in zip(work, keys) if k not in done]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            ran = [_kept(row, partial) for row in pool.map(_row_job, jobs_in)]
    else:
        ran = [_kept(run_case(c, series=series, log=log, perturbation=p, reuse=r), partial) for c, p, _s, r in jobs_in]
    fresh = iter(ran)
    rows = [done[k] if k in done else next(fresh) for k in keys]
    decision = [r[key]["decisionCpuMs"] for r in rows for key, *_ in TUNED_RUNS if r.get(key) is not None]
    return {
        "cases": rows,
        "wallSeconds": time.perf_counter() - started,
        # Children's CPU as well as this process's, so --jobs reports what the suite cost, not the parent's.
        "cpuSeconds": time.process_time() - cpu if jobs <= 1 else sum(r["cpuSeconds"] for r in ran),
        "decisionCpuMs": {"mean": sum(d["mean"] * d["decisions"] for d in decision)
                          / max(1, sum(d["decisions"] for d in decision)),
                          "max": max((d["max"] for d in decision), default=0.0)},
        "allPass": all(all(r["criteria"].values()) for r in rows), "spareGpu": spare_gpu,
        "perturbations": perturbations or ["nominal"], "backend": backend, "canary": canary,
        # Every failed criterion is one the instant reference misses too (see missed_by_instant()).
        "failuresAllMissedByInstant": all(set(k for k, v in r["criteria"].items() if not v) <= set(r["missedByInstant"])
                                          for r in rows),
    }


def main(as_json: bool, only: list[str] | None = None, spare_gpu: bool = True,
         perturbations: list[str] | None = None, jobs: int = 1, bounds: str | None = None,
         partial: str | None = None, backend: str = "tensorrt", canary: str = "Off", resume: bool = False) -> int:
    if resume and not partial:
        raise SystemExit("kvpilot bench tuner --resume: needs --partial FILE (the rows it keeps and appends to)")
    out = run_suite(as_json, only, series=as_json, spare_gpu=spare_gpu, perturbations=perturbations, jobs=jobs,
                    bounds=load_bounds(bounds) if bounds else None, partial=partial, backend=backend, canary=canary,
                    resume=resume)
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print(table(out["cases"]))
        print(summary_line(out))
    return 0
