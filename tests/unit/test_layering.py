"""The pure layers import nothing that does I/O; the simulator imports nothing from kvpilot."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PURE = ["operator/kvpilot/api", "operator/kvpilot/trtllm", "operator/kvpilot/desired", "operator/kvpilot/autotune"]
IO_MODULES = ("kopf", "kubernetes", "aiohttp", "requests", "urllib3", "kvpilot.k8s", "kvpilot.observe",
              "kvpilot.handlers", "kvpilot.reconcile", "kvpilot.loop")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_pure_layers_do_no_io() -> None:
    bad = []
    for folder in PURE:
        for path in (ROOT / folder).rglob("*.py"):
            for mod in imports(path):
                if any(mod == m or mod.startswith(m + ".") for m in IO_MODULES):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert bad == []


def test_only_k8s_talks_to_the_api_server() -> None:
    bad = []
    for path in (ROOT / "operator/kvpilot").rglob("*.py"):
        if "k8s" in path.parts:
            continue
        for mod in imports(path):
            if mod == "kubernetes" or mod.startswith("kubernetes."):
                bad.append(str(path.relative_to(ROOT)))
    assert bad == []


def test_handlers_are_thin() -> None:
    for path in (ROOT / "operator/kvpilot/handlers").rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 150, path


def test_simulator_is_independent_of_kvpilot_and_kubernetes() -> None:
    bad = []
    for path in (ROOT / "simulator/kvsim").rglob("*.py"):
        for mod in imports(path):
            if mod.split(".")[0] in ("kvpilot", "kubernetes", "kopf"):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert bad == []
