"""Entry point of ``kvpilot bench tuner`` (implemented with the simulator in ``tuner.py``)."""

from __future__ import annotations

import argparse
import sys

# (flag, attribute, lowest allowed, whether the lowest itself is allowed): checked before any simulation runs,
# so a typo costs one line, not minutes of simulated traffic followed by a traceback.
NUMBER_FLAGS = (("--replicas", "replicas", 1, True), ("--restart-seconds", "restart_seconds", 0.0, True),
                ("--ceiling", "ceiling", 1, True), ("--rate-scale", "rate_scale", 0.0, False),
                ("--duration-seconds", "duration_seconds", 0.0, False),
                ("--slo-ttft-ms", "slo_ttft_ms", 0.0, False), ("--slo-tpot-ms", "slo_tpot_ms", 0.0, False))


def run_bench(args: argparse.Namespace) -> int:
    if args.suite:
        if args.jobs < 1:
            print(f"kvpilot bench tuner: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
            return 2
        from kvpilot.bench.perturb import PERTURBATIONS
        from kvpilot.bench.suite import main as suite_main

        perturbations = args.perturbation or (["nominal", *PERTURBATIONS] if args.perturbed else ["nominal"])
        return suite_main(args.json, args.case, spare_gpu=not args.no_spare_gpu, perturbations=perturbations,
                          jobs=args.jobs, bounds=args.bounds, partial=args.partial, backend=args.backend,
                          canary=args.canary, resume=args.resume)
    missing = [flag for flag, value in (("--workload", args.workload), ("--profile", args.profile),
                                        ("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms))
               if value is None]
    if missing:
        print(f"kvpilot bench tuner: {', '.join(missing)} required (or --suite)", file=sys.stderr)
        return 2
    problem = input_problem(args)
    if problem:
        print(f"kvpilot bench tuner: {problem}", file=sys.stderr)
        return 2
    from kvpilot.bench.tuner import main

    return main(args)


def input_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the single-workload flags, naming the flag; None when the run can start."""
    for flag, name, lowest, inclusive in NUMBER_FLAGS:
        value = getattr(args, name)
        if value is not None and not (value >= lowest if inclusive else value > lowest):
            return f"{flag} must be {'>=' if inclusive else '>'} {lowest:g}, got {value:g}"
    from kvsim.profiles import get_profile
    from kvsim.workload import WorkloadError, load_workload

    try:
        get_profile(args.profile)
    except KeyError as exc:
        return f"--profile: {exc.args[0] if exc.args else exc}"
    try:
        load_workload(args.workload)
    except WorkloadError as exc:
        return f"--workload: {exc}"
    return None
