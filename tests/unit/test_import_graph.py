"""The module import graphs of kvsim and kvpilot have no cycles, and only the listed kvpilot modules import kvsim.

A cycle means two modules can only be understood (and imported) together; one hidden behind an import inside a
function is still a cycle, and so is one behind ``if TYPE_CHECKING:`` (it never runs, but neither module can be
read or type-checked without the other): every import statement counts, wherever it is. The graph is built from
the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = {"kvsim": ROOT / "simulator" / "kvsim", "kvpilot": ROOT / "operator" / "kvpilot"}

# kvpilot uses kvsim only as a model library, in these modules (and their packages): the autotuner's what-if
# check, its engine model calibrated to the pods (calibrate, iterations, engine_model, trust) and its fleet of
# simulated engines (which the benchmark shares), and the benchmark itself. Everything else in the operator,
# in particular what talks to the API server or renders objects, must not depend on the simulator.
KVSIM_IMPORTERS = ("kvpilot.autotune.whatif", "kvpilot.autotune.replay",
                   "kvpilot.autotune.fleet", "kvpilot.autotune.calibrate",
                   "kvpilot.autotune.iterations", "kvpilot.autotune.engine_model", "kvpilot.autotune.trust",
                   "kvpilot.bench")


def module_name(package: str, path: Path) -> str:
    parts = path.relative_to(PACKAGES[package]).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def imported_modules(package: str, path: Path) -> set[str]:
    """Every module ``path`` imports (relative imports resolved; ``from m import x`` also yields ``m.x``)."""
    name = module_name(package, path)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while stack:
        node = stack.pop()
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (only names that are modules of the package)."""
    files = {module_name(package, p): p for p in PACKAGES[package].rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        # An edge to one's own package is no dependency: the package is imported before any module in it.
        graph[name] = {m for m in imported_modules(package, path)
                       if m in files and m != name and not name.startswith(m + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path [a, b, ..., a], or None (iterative depth-first search)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path = [start]
        iters = [iter(sorted(graph[start]))]
        colour[start] = GREY
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                iters.pop()
            elif colour[nxt] == GREY:
                return path[path.index(nxt):] + [nxt]
            elif colour[nxt] == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package: str) -> None:
    cycle = find_cycle(import_graph(package))
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle or [])}"


def test_the_cycle_finder_finds_cycles() -> None:
    """The check above could pass by finding nothing at all: it must see a cycle, a self-contained one included."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph = import_graph("kvsim")
    assert "kvsim.scheduler" in graph["kvsim.engine"], "the graph misses relative imports"
    assert "kvsim.serve.openai_api" in graph["kvsim.serve.app"]


def cycle_of_two_modules(tmp_path: Path, b_source: str) -> list[str] | None:
    """The cycle the finder sees in a package whose ``a`` imports ``b`` at the top and whose ``b`` is ``b_source``."""
    pkg = tmp_path / "kvsim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text(b_source)
    saved = PACKAGES["kvsim"]
    PACKAGES["kvsim"] = pkg
    try:
        return find_cycle(import_graph("kvsim"))
    finally:
        PACKAGES["kvsim"] = saved


def test_imports_inside_functions_count(tmp_path: Path) -> None:
    """An import inside a function body is an edge (that is how the serve/app cycle used to hide)."""
    found = cycle_of_two_modules(tmp_path, "def f():\n    from .a import y\n    return y\nx = 1\n")
    assert found == ["kvsim.a", "kvsim.b", "kvsim.a"]


def test_typing_only_imports_count(tmp_path: Path) -> None:
    """An import under ``if TYPE_CHECKING:`` is an edge: k8s/api.py <-> k8s/events.py was such a circle, and this
    test missed it while it skipped those blocks."""
    found = cycle_of_two_modules(tmp_path, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\nx = 1\n")
    assert found == ["kvsim.a", "kvsim.b", "kvsim.a"]


def package_of(module: str) -> str:
    """``kvpilot.desired.plan`` -> ``kvpilot.desired``; a top-level module (``kvpilot.loop``) is its own node."""
    return ".".join(module.split(".")[:2])


def package_graph(package: str) -> dict[str, set[str]]:
    """The import graph between a package's subpackages (edges inside one subpackage dropped)."""
    out: dict[str, set[str]] = {}
    for module, deps in import_graph(package).items():
        node = package_of(module)
        out.setdefault(node, set()).update(package_of(d) for d in deps if package_of(d) != node)
    return out


# The layers below the operator's I/O, with every kvpilot package each may import. A pure layer never reaches
# up: the tuner (autotune) is the plan's input, so it must not import the plan (desired), and none of them may
# import what talks to the API server (k8s), scrapes pods (observe) or benchmarks (bench).
PURE_LAYERS = {
    "kvpilot.api": set(),
    "kvpilot.trtllm": {"kvpilot.api"},
    "kvpilot.autotune": {"kvpilot.api", "kvpilot.trtllm"},  # the window is summarized from trtllm's typed samples
    "kvpilot.desired": {"kvpilot.api", "kvpilot.autotune", "kvpilot.trtllm"},
}


def test_no_cycles_between_kvpilot_packages() -> None:
    """Module cycles are forbidden above; a package cycle (autotune -> desired -> autotune through different
    modules) is one too: neither package can then be understood, tested or shipped without the other."""
    graph = package_graph("kvpilot")
    assert {"kvpilot.api", "kvpilot.autotune", "kvpilot.desired", "kvpilot.k8s", "kvpilot.bench"} <= graph.keys()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between kvpilot packages: {' -> '.join(cycle or [])}"
    # The check must see one: the tuner importing the plan again (the cycle issue 9 removed) is a cycle.
    with_regression = {**graph, "kvpilot.autotune": graph["kvpilot.autotune"] | {"kvpilot.desired"}}
    assert find_cycle(with_regression) is not None


@pytest.mark.parametrize("layer", sorted(PURE_LAYERS))
def test_pure_layers_import_only_the_layers_below(layer: str) -> None:
    imports = package_graph("kvpilot")[layer]
    assert imports <= PURE_LAYERS[layer], f"{layer} imports {sorted(imports - PURE_LAYERS[layer])}"


def test_kvsim_never_imports_kvpilot() -> None:
    bad = [f"{module_name('kvsim', p)} imports {m}" for p in PACKAGES["kvsim"].rglob("*.py")
           for m in imported_modules("kvsim", p) if m.split(".")[0] == "kvpilot"]
    assert bad == []


def test_only_the_model_library_users_import_kvsim() -> None:
    """kvsim is a model library for the what-if check and the benchmark; nothing else in kvpilot imports it."""
    users = sorted(module_name("kvpilot", p) for p in PACKAGES["kvpilot"].rglob("*.py")
                   if any(m.split(".")[0] == "kvsim" for m in imported_modules("kvpilot", p)))
    assert users, "no kvpilot module imports kvsim: is the scan broken?"
    bad = [u for u in users if not any(u == allowed or u.startswith(allowed + ".") for allowed in KVSIM_IMPORTERS)]
    assert bad == [], f"these kvpilot modules import kvsim but are not in KVSIM_IMPORTERS: {bad}"


def closure(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    """Every module reachable from ``roots`` (a module also loads the packages above it)."""
    seen: set[str] = set()
    todo = sorted(roots)
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in graph:
            continue
        seen.add(mod)
        parents = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        todo.extend(graph[mod] | parents)
    return seen


def test_the_operator_image_keeps_exactly_the_kvsim_modules_kvpilot_imports() -> None:
    """The Dockerfile removes from the operator image the kvsim parts no kvpilot module can reach (its server,
    trtllm stand-ins, CLI and offline tools). Removing one the operator reaches would break it at run time;
    forgetting a new part the operator never uses would ship it. The bundled workload files stay (data that
    ``kvsim.load_workload``, which the operator reaches, reads)."""
    import re

    dockerfile = (ROOT / "Dockerfile").read_text()
    found = re.search(r'^ARG KVSIM_NOT_IN_OPERATOR="([^"]*)"', dockerfile, re.M)
    assert found, "the Dockerfile no longer names the kvsim parts it removes (ARG KVSIM_NOT_IN_OPERATOR)"
    removed = {"kvsim." + part.removesuffix(".py") for part in found.group(1).split()}
    kvsim_graph = import_graph("kvsim")
    # kvpilot's own parts that the image leaves out (its benchmark) do not keep kvsim parts in it either.
    left_out = re.search(r'^ARG KVPILOT_NOT_IN_OPERATOR="([^"]*)"', dockerfile, re.M)
    skipped = [PACKAGES["kvpilot"] / part for part in (left_out.group(1).split() if left_out else ())]
    roots = {m for p in PACKAGES["kvpilot"].rglob("*.py") if not any(p.is_relative_to(s) for s in skipped)
             for m in imported_modules("kvpilot", p) if m.split(".")[0] == "kvsim"}
    reached = closure(kvsim_graph, roots)
    assert "kvsim.engine" in reached and "kvsim.serve.server" not in reached
    top_level = {m for m in kvsim_graph if m.count(".") == 1} - {"kvsim.workloads"}
    assert removed <= top_level, f"the Dockerfile removes what kvsim does not have: {sorted(removed - top_level)}"
    assert removed & reached == set(), f"the operator imports these, the image must keep them: {sorted(removed & reached)}"
    assert top_level - reached == removed, (
        f"kvsim parts no kvpilot module imports, still shipped in the operator image: {sorted(top_level - reached - removed)}")


def test_kvsim_declares_every_distribution_it_imports() -> None:
    """kvsim is installed on its own (the kvsim image holds nothing else), so every third-party module it imports
    must come from a requirement or an extra of simulator/pyproject.toml."""
    import re
    import sys
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "simulator" / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    declared_names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in declared}
    providers = packages_distributions()
    third_party = {m.split(".")[0] for p in PACKAGES["kvsim"].rglob("*.py") for m in imported_modules("kvsim", p)
                   if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "kvsim"}
    assert "yaml" in third_party
    missing = {m: providers.get(m) for m in third_party
               if not {d.lower().replace("_", "-") for d in providers.get(m, [m])} & declared_names}
    assert missing == {}, f"kvsim imports these without declaring their distribution: {missing}"
