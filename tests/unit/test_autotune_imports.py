"""The tuner is a leaf: it must not import kvpilot.desired, which imports the tuner (an import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvpilot.autotune

AUTOTUNE = Path(kvpilot.autotune.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_autotune_module_imports_desired() -> None:
    files = sorted(AUTOTUNE.glob("*.py"))
    assert files, AUTOTUNE
    offenders = {f.name: sorted(m for m in imported_modules(f) if m.startswith("kvpilot.desired"))
                 for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_kv_window_is_one_class_wherever_it_is_imported_from() -> None:
    from kvpilot.autotune.window import KvWindow
    from kvpilot.desired.observed import KvWindow as Reexported

    assert Reexported is KvWindow
