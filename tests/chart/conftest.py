"""Fixtures for the chart tests: find helm, render charts/kvpilot with given values, cache the output.

The tests check what `helm template` renders, so they need a helm binary. It comes from the local
control-plane cache that hack/testenv/build.sh fills (helm from the npm layer package); CI builds it
before running the tests. Without helm the tests skip and say so.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART_DIR,
    KUBE_VERSION,
    RELEASE,
    RELEASE_NAMESPACE,
    VARIANTS,
    Helm,
    Manifest,
    find_helm,
)

Renderer = Callable[..., list[Manifest]]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = find_helm()
    if binary is None or not binary.exists():
        pytest.skip(
            "helm not found: run hack/testenv/build.sh (it puts helm in ~/.cache/kvpilot/testenv/<key>/bin), "
            "or set KVPILOT_HELM=/path/to/helm"
        )
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


def _template_args(values_files: Iterable[Path], namespace: str, kube_version: str) -> list[str]:
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", namespace, "--kube-version", kube_version]
    for path in values_files:
        args += ["--values", str(path)]
    return args


@pytest.fixture(scope="session")
def render_result(
    helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`helm template` with values given as a dict and/or ci/ files; returns the process (for failures)."""
    values_dir = tmp_path_factory.mktemp("values")
    cache: dict[str, subprocess.CompletedProcess[str]] = {}

    def run(
        values: Mapping[str, Any] | None = None,
        ci_files: Iterable[str] = (),
        namespace: str = RELEASE_NAMESPACE,
        kube_version: str = KUBE_VERSION,
    ) -> subprocess.CompletedProcess[str]:
        ci_files = tuple(ci_files)
        key = yaml.safe_dump([values or {}, ci_files, namespace, kube_version], sort_keys=True)
        if key not in cache:
            files = [CHART_DIR / "ci" / name for name in ci_files]
            if values:
                path = values_dir / f"values-{len(cache)}.yaml"
                path.write_text(yaml.safe_dump(dict(values)))
                files.append(path)
            cache[key] = helm.run(*_template_args(files, namespace, kube_version))
        return cache[key]

    return run


@pytest.fixture(scope="session")
def render(render_result: Callable[..., subprocess.CompletedProcess[str]]) -> Renderer:
    """Render the chart and return its objects (dicts); fails the test with helm's message if it errors."""

    def run(values: Mapping[str, Any] | None = None, ci_files: Iterable[str] = (), **kwargs: Any) -> list[Manifest]:
        result = render_result(values, ci_files, **kwargs)
        if result.returncode != 0:
            pytest.fail(f"helm template failed (values={values}, ci={list(ci_files)}):\n{result.stderr}")
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    return run


@pytest.fixture(params=sorted(VARIANTS), scope="session")
def variant_objects(request: pytest.FixtureRequest, render: Renderer) -> list[Manifest]:
    """The rendered objects of one variant (parametrized over VARIANTS)."""
    return render(ci_files=VARIANTS[request.param])
