"""Entry point of ``kvpilot bench tuner`` (implemented with the simulator in ``tuner.py``)."""

from __future__ import annotations

import argparse
import sys


def run_bench(args: argparse.Namespace) -> int:
    if args.suite:
        from kvpilot.bench.suite import main as suite_main

        return suite_main(args.json, args.case, spare_gpu=not args.no_spare_gpu)
    missing = [flag for flag, value in (("--workload", args.workload), ("--profile", args.profile),
                                        ("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms))
               if value is None]
    if missing:
        print(f"kvpilot bench tuner: {', '.join(missing)} required (or --suite)", file=sys.stderr)
        return 2
    from kvpilot.bench.tuner import main

    return main(args)
