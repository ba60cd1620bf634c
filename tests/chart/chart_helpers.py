"""Helpers shared by the chart tests: locate helm, run it in isolation, and read rendered objects.

Kept out of conftest.py so test modules can import them by a unique module name.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kvpilot"
# The Kubernetes version the chart is rendered for: the local control plane's minor (hack/testenv).
KUBE_VERSION = "1.36.0"
RELEASE = "kvpilot"
RELEASE_NAMESPACE = "kvpilot-system"

Manifest = dict[str, Any]


def find_helm() -> Path | None:
    """The helm binary: $KVPILOT_HELM, else the testenv cache (laid out as hack/testenv/build.sh does), else PATH.

    Any cache key will do: the chart tests only run `helm template` and `helm lint`.
    """
    explicit = os.environ.get("KVPILOT_HELM")
    if explicit:
        return Path(explicit)
    cache_root = os.environ.get("KVPILOT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvpilot"
    )
    for candidate in sorted(glob.glob(os.path.join(cache_root, "testenv", "*", "bin", "helm"))):
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    on_path = shutil.which("helm")
    return Path(on_path) if on_path else None


class Helm:
    """Runs helm with its cache, config and data homes in a private temporary folder.

    Why: helm otherwise reads and writes ~/.config/helm and ~/.cache/helm; a test must neither depend
    on a developer's repositories and plugins nor leave files behind.
    """

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = dict(os.environ)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            path = home / sub
            path.mkdir(parents=True, exist_ok=True)
            self.env[var] = str(path)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `helm ARGS`; the caller checks returncode (some tests expect a failure)."""
        return subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, text=True, timeout=120, check=False
        )


# The value sets every structural test runs against: the defaults and each ci/ values file, alone and
# combined, so no variant escapes a check.
VARIANTS: dict[str, tuple[str, ...]] = {
    "clusterwide": (),
    "namespaced": ("namespaced-values.yaml",),
    "monitoring": ("monitoring-values.yaml",),
    "namespaced+monitoring": ("namespaced-values.yaml", "monitoring-values.yaml"),
}


def objects_of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj.get("kind") == kind]


def only_object(objects: Iterable[Manifest], kind: str) -> Manifest:
    found = objects_of_kind(objects, kind)
    assert len(found) == 1, f"expected exactly one {kind}, rendered {len(found)}"
    return found[0]
