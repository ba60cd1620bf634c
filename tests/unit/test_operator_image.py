"""The operator image leaves kvpilot's benchmark out (Dockerfile, KVPILOT_NOT_IN_OPERATOR): the operator never
imports it, and the CLI without it still answers every command, `kvpilot bench` with a clear message.

Building the image needs podman and the network (tests/chart/test_images.py runs against the built one); this
checks the same removal on a copy of the package, so it runs everywhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.unit.test_import_graph import PACKAGES, ROOT, closure, import_graph


def removed_parts() -> set[str]:
    found = re.search(r'^ARG KVPILOT_NOT_IN_OPERATOR="([^"]*)"', (ROOT / "Dockerfile").read_text(), re.M)
    assert found, "the Dockerfile no longer names the kvpilot parts it removes (ARG KVPILOT_NOT_IN_OPERATOR)"
    return {"kvpilot." + part for part in found.group(1).split()}


def test_the_operator_never_reaches_the_benchmark() -> None:
    assert removed_parts() == {"kvpilot.bench"}
    graph = import_graph("kvpilot")
    reached = closure(graph, {"kvpilot.operator"})
    assert "kvpilot.loop" in reached and not any(m.startswith("kvpilot.bench") for m in reached)
    # Outside the benchmark, only the CLI names it, behind a check that it is installed.
    users = sorted(m for m, deps in graph.items() if not m.startswith("kvpilot.bench")
                   and any(d.startswith("kvpilot.bench") for d in deps))
    assert users == ["kvpilot.cli"]
    assert 'importlib.util.find_spec("kvpilot.bench") is None' in (PACKAGES["kvpilot"] / "cli.py").read_text()


def test_the_cli_without_the_benchmark_answers_and_says_where_it_is(tmp_path: Path) -> None:
    shutil.copytree(PACKAGES["kvpilot"], tmp_path / "kvpilot",
                    ignore=shutil.ignore_patterns("__pycache__", *[p.split(".", 1)[1] for p in removed_parts()]))
    assert not (tmp_path / "kvpilot" / "bench").exists()
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import kvpilot, kvpilot.operator; "
             f"assert kvpilot.__file__.startswith({str(tmp_path)!r}), kvpilot.__file__; "
             "from kvpilot.cli import main; code = main(sys.argv[1:]); print('exit', code)")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)

    helped = cli("--help")
    assert helped.returncode == 0 and "bench" in helped.stdout, helped.stderr
    crd = cli("crd")
    assert crd.returncode == 0 and "exit 0" in crd.stdout and "CustomResourceDefinition" in crd.stdout, crd.stderr
    bench = cli("bench", "tuner", "--suite", "--json")
    assert "exit 2" in bench.stdout and "the benchmark is not installed here" in bench.stderr, bench.stderr
