"""Invariants of the operator image, read from the Dockerfile (no Docker engine on our machines).

They tie the image to the chart: the uid the chart runs as, the ports it probes, the entrypoint it calls.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field

import yaml
from chart_helpers import CHART_DIR, REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
BUILD_TOOLS = ("gcc", "g++", "clang", "make", "build-essential", "cmake", "cargo", "rustc", "python3-dev", "libc6-dev")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def stages(text: str) -> list[Stage]:
    """Build stages, with FROM's ${ARG} resolved from the global ARG defaults."""
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "ARG" and not found:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            found.append(Stage(base=base, name=name))
        elif found:
            found[-1].instructions.append((keyword, args))
    return found


def final_stage() -> Stage:
    return stages(DOCKERFILE.read_text())[-1]


def test_multi_stage_with_a_wheel_builder() -> None:
    all_stages = stages(DOCKERFILE.read_text())
    assert len(all_stages) >= 2
    builder = all_stages[0]
    assert builder.name, "the builder stage must be named so the final stage can take its output"
    assert any("pip wheel" in run or "-m build" in run for run in builder.args_of("RUN"))


def test_final_stage_is_python_311_slim() -> None:
    assert final_stage().base.startswith("python:3.11-slim")


def test_final_stage_has_no_build_tools_or_source() -> None:
    stage = final_stage()
    for run in stage.args_of("RUN"):
        words = set(re.split(r"[\s;&|]+", run))
        assert not words & set(BUILD_TOOLS), f"build tools installed in the final stage: {run}"
        if "pip install" in run:
            assert "--no-index" in run, "the final stage installs only the builder's wheels"
    for copy in stage.args_of("COPY") + stage.args_of("ADD"):
        assert "--from=" in copy, f"the final stage copies from the build context: {copy}"


def test_runs_as_the_numeric_non_root_uid_the_chart_uses() -> None:
    users = final_stage().args_of("USER")
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER must be a numeric non-zero uid, got {users[-1]!r}"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    chart_uid = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert int(uid) == chart_uid
    # USER must come after the last RUN, so nothing later runs as root and leaves root-owned state.
    keywords = [kw for kw, _ in final_stage().instructions]
    assert max(i for i, kw in enumerate(keywords) if kw == "USER") > max(
        i for i, kw in enumerate(keywords) if kw == "RUN"
    )


def test_entrypoint_and_default_command() -> None:
    stage = final_stage()
    assert json.loads(stage.args_of("ENTRYPOINT")[-1]) == ["kvpilot"]
    assert json.loads(stage.args_of("CMD")[-1]) == ["run", "--all-namespaces"]


def test_exposes_the_ports_the_chart_uses() -> None:
    exposed = {int(p.split("/")[0]) for line in final_stage().args_of("EXPOSE") for p in line.split()}
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert exposed == {values["metrics"]["port"], values["health"]["port"]}


def test_oci_labels() -> None:
    labels = " ".join(final_stage().args_of("LABEL"))
    for key in ("title", "source", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes `path` (last matching pattern wins; a pattern matching a parent counts)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        regex = fnmatch.translate(pattern).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        if pattern.startswith("**/"):
            regex = "(.*/)?" + fnmatch.translate(pattern[3:]).replace(".*", "[^/]*")
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_dockerignore_matcher_semantics() -> None:
    patterns = ["*", "!operator", "**/__pycache__"]
    assert ignored(".venv/bin/python", patterns)
    assert not ignored("operator/kvpilot/cli.py", patterns)
    assert ignored("operator/kvpilot/__pycache__/cli.pyc", patterns)


def test_builder_sources_exist_and_are_in_the_build_context() -> None:
    patterns = dockerignore_patterns()
    builder = stages(DOCKERFILE.read_text())[0]
    for copy in builder.args_of("COPY"):
        if "--from=" in copy:
            continue
        *sources, _dest = shlex.split(copy)
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"the builder copies {source}, which the repository lacks"
            assert not ignored(source.rstrip("/"), patterns), f".dockerignore excludes {source}"


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = dockerignore_patterns()
    for path in (
        ".venv/bin/python",
        ".git/config",
        ".testenv/kubeconfig",
        "tests/chart/conftest.py",
        "kvpilot.egg-info/PKG-INFO",
    ):
        assert ignored(path, patterns), path


def test_readme_is_in_the_context_when_pyproject_names_it() -> None:
    """setuptools reads project.readme while building the wheel; a context without it fails the build."""
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    match = re.search(r'^readme\s*=\s*"([^"]+)"', pyproject, re.MULTILINE)
    if match:
        assert not ignored(match.group(1), dockerignore_patterns())
        assert any(match.group(1) in copy.split() for copy in stages(DOCKERFILE.read_text())[0].args_of("COPY"))
