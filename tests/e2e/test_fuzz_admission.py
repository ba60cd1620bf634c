"""A sample of the hostile-manifest corpus against the real API server: admission and `kvpilot render`'s
offline validator give the same verdict on each (issue 13: admission must agree with the API server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpilot.api.crd import spec_openapi
from kvpilot.api.manifest_file import documents
from kvpilot.api.validate import validate_manifest
from tests.e2e.conftest import run_kubectl
from tests.fuzz.generate import OUT

# Manifests the strict reader parses (the file-* family attacks the reader, which kubectl's YAML differs on);
# every third one keeps the run short while covering every field the corpus attacks.
SAMPLE = [f for f in sorted(OUT.glob("*.yaml")) if not f.name.startswith("file-")][::3]


def offline_errors(path: Path) -> list[str]:
    (_n, doc), = documents(path.read_text(), path.name)
    _out, errors = validate_manifest(doc, spec_openapi())
    return [str(e) for e in errors]


@pytest.mark.parametrize("path", SAMPLE, ids=[f.name for f in SAMPLE])
def test_admission_and_the_offline_validator_agree(chart: str, path: Path) -> None:
    errors = offline_errors(path)
    doc = yaml.safe_load(path.read_text())
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"].setdefault("namespace", "default")
    result = run_kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
    server_accepts = result.returncode == 0
    assert server_accepts == (not errors), (
        f"{path.name}: API server {'accepted' if server_accepts else 'refused'} "
        f"({result.stderr.strip()[:600]}), offline: {errors[:5]}")
