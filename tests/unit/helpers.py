"""Builders for unit tests: typed engines from the shared manifests, with overrides by dotted path."""

from __future__ import annotations

from typing import Any

from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine, InferenceEngineSpec, ObjectRef, parse_spec
from kvpilot.api.validate import validate_manifest
from tests.cases.engines import base, override


def manifest(backend: str = "simulated", name: str = "e1", **overrides: Any) -> dict[str, Any]:
    """``overrides`` use '__' for '.': build__maxBatchSize=1024."""
    return override(base(name, backend), **overrides)


def spec_of(doc: dict[str, Any]) -> InferenceEngineSpec:
    out, errors = validate_manifest(doc, spec_openapi())
    assert not errors, [str(e) for e in errors]
    return parse_spec(out["spec"])


def engine(backend: str = "simulated", name: str = "e1", uid: str = "uid-1", generation: int = 1,
           **overrides: Any) -> InferenceEngine:
    doc = manifest(backend, name, **overrides)
    return InferenceEngine(ObjectRef(name, "ns", uid, generation), spec_of(doc))
