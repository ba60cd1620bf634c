"""Offline admission: every invalid case is rejected naming its field and what must hold; examples pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpilot.api.crd import spec_openapi
from kvpilot.api.validate import validate_manifest
from tests.cases.engines import INVALID, VALID_EDGES, base, invalid_case, valid_edge

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("case", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_engine_is_rejected_naming_the_field(case: tuple) -> None:
    case_id, _path, _value, field, words = case
    _doc, errors = validate_manifest(invalid_case(case_id), spec_openapi())
    assert errors, f"{case_id} was accepted"
    matching = [e for e in errors if e.path == field]
    assert matching, f"{case_id}: no error on {field}: {[str(e) for e in errors]}"
    assert any(words in e.message for e in matching), [str(e) for e in matching]


def test_there_are_at_least_twenty_invalid_cases() -> None:
    assert len(INVALID) >= 20


def test_the_valid_base_is_accepted_for_every_backend() -> None:
    for backend in ("simulated", "tensorrt"):
        _doc, errors = validate_manifest(base(backend=backend), spec_openapi())
        assert errors == [], [str(e) for e in errors]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        _out, errors = validate_manifest(doc, spec_openapi())
        assert errors == [], [str(e) for e in errors]


def test_defaults_fill_nested_objects() -> None:
    doc, errors = validate_manifest(base(), spec_openapi())
    assert not errors
    spec = doc["spec"]
    assert spec["build"]["kvCache"] == {"type": "paged", "tokensPerBlock": 32}
    assert spec["batching"]["maxBatchSize"] == 64
    assert spec["serving"]["rollout"] == {"strategy": "Auto", "maxSurge": 0, "maxUnavailable": 1}
    assert spec["autotune"]["mode"] == "Advisory"


def test_user_values_are_not_overwritten_by_defaults() -> None:
    doc = base()
    doc["spec"]["build"] = {"maxBatchSize": 2048, "kvCache": {"tokensPerBlock": 64}}
    out, errors = validate_manifest(doc, spec_openapi())
    assert not errors
    assert out["spec"]["build"]["maxBatchSize"] == 2048
    assert out["spec"]["build"]["kvCache"] == {"type": "paged", "tokensPerBlock": 64}


@pytest.mark.parametrize("case", VALID_EDGES, ids=[c[0] for c in VALID_EDGES])
def test_real_names_at_the_edge_of_the_restrictions_are_accepted(case: tuple) -> None:
    _doc, errors = validate_manifest(valid_edge(case[0]), spec_openapi())
    assert errors == [], [str(e) for e in errors]


def test_long_values_are_cut_in_messages() -> None:
    doc = base()
    doc["spec"]["model"]["source"] = "x" * 10_000_000
    _doc, errors = validate_manifest(doc, spec_openapi())
    text = "\n".join(str(e) for e in errors)
    assert "10000000 characters" in text and len(text) < 2000, text[:3000]


def test_metadata_as_a_list_is_a_field_error() -> None:
    doc = base()
    doc["metadata"] = ["name", "x"]
    _doc, errors = validate_manifest(doc, spec_openapi())
    assert any(e.path == "metadata" and "object" in e.message for e in errors), [str(e) for e in errors]
