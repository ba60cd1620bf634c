"""Entry point of ``kvpilot bench tuner`` (implemented with the simulator in ``tuner.py``)."""

from __future__ import annotations

import argparse


def run_bench(args: argparse.Namespace) -> int:
    from kvpilot.bench.tuner import main

    return main(args)
