"""Run every benchmark in this folder (``make bench``); each prints its own figures."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    for mod in sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_")):
        print(f"==> tests.bench.{mod}", flush=True)
        module = importlib.import_module(f"tests.bench.{mod}")
        if hasattr(module, "main"):
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
