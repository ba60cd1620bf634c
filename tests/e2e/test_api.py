"""The CRD on a real API server: accepted, explained, printed; invalid engines rejected at admission."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.cases.engines import INVALID, VALID_EDGES, base, invalid_case, valid_edge
from tests.e2e.conftest import ROOT, apply, kubectl, run_kubectl

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_crd_is_established(chart: str) -> None:
    out = kubectl("get", "crd", "inferenceengines.serving.kvpilot.io", "-o",
                  "jsonpath={.status.conditions[?(@.type=='Established')].status}")
    assert out == "True"


def test_kubectl_explain_teaches_the_build_section(chart: str) -> None:
    out = kubectl("explain", "inferenceengine.spec.build")
    for needle in ("maxBatchSize", "ceiling", "kvCache", "quantization", "fingerprint"):
        assert needle in out, needle
    leaf = kubectl("explain", "ie.spec.build.kvCache.tokensPerBlock")
    assert "power of two" in leaf


def test_printer_columns(chart: str, ns: str) -> None:
    apply({**base("columns"), "metadata": {"name": "columns", "namespace": ns}})
    header = kubectl("get", "ie", "-n", ns).splitlines()[0].split()
    assert header == ["NAME", "READY", "BACKEND", "BATCH", "KV%", "MODEL", "REPLICAS", "AGE"]
    wide = kubectl("get", "ie", "-n", ns, "-o", "wide").splitlines()[0].split()
    assert wide == ["NAME", "READY", "BACKEND", "BATCH", "KV%", "MODEL", "REPLICAS", "GROUPS", "PODS/GROUP", "ENGINE",
                    "REASON", "AGE"]


@pytest.mark.parametrize("case", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_engine_is_rejected_at_admission(chart: str, case: tuple) -> None:
    case_id, _path, _value, field, words = case
    doc = invalid_case(case_id)
    doc["metadata"]["namespace"] = "default"
    result = run_kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
    assert result.returncode != 0, f"{case_id} was accepted: {result.stdout}"
    assert field.split(".")[-1] in result.stderr and words in result.stderr, result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_accepted(chart: str, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        d = copy.deepcopy(doc)
        d["metadata"]["namespace"] = "default"
        out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(d))
        assert "created (server dry run)" in out or "configured (server dry run)" in out


@pytest.mark.parametrize("case", VALID_EDGES, ids=[c[0] for c in VALID_EDGES])
def test_names_at_the_edge_of_the_restrictions_are_accepted(chart: str, case: tuple) -> None:
    doc = valid_edge(case[0])
    doc["metadata"]["namespace"] = "default"
    out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
    assert "(server dry run)" in out
