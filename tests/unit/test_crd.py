"""The CRD: generated files are current, the schema is structural and self-describing."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvpilot.api.crd import PRINTER_COLUMNS, crd, render_crd_yaml
from kvpilot.api.openapi import walk_properties

ROOT = Path(__file__).parents[2]
CRD_FILES = [ROOT / "crds/serving.kvpilot.io_inferenceengines.yaml",
             ROOT / "charts/kvpilot/files/crds/serving.kvpilot.io_inferenceengines.yaml"]


def _schema() -> dict:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_files_match_the_generator() -> None:
    expected = render_crd_yaml()
    for path in CRD_FILES:
        assert path.read_text() == expected, f"{path} is stale: run `make crds`"


def test_every_field_has_a_description() -> None:
    missing = [p for p, s in walk_properties(_schema()["properties"]["spec"], "spec").items() if not s.get("description")]
    missing += [p for p, s in walk_properties(_schema()["properties"]["status"], "status").items()
                if not s.get("description")]
    assert missing == []


def test_schema_is_structural() -> None:
    """Every object declares its properties (or is a typed map); every node has a type or int-or-string."""
    problems = []
    for path, node in walk_properties(_schema()).items():
        if path in ("metadata", "apiVersion", "kind"):
            continue
        if node.get("type") is None and not node.get("x-kubernetes-int-or-string"):
            problems.append(f"{path}: no type")
        if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
            problems.append(f"{path}: object without properties")
        if node.get("type") == "array" and "maxItems" not in node:
            problems.append(f"{path}: array without maxItems (CEL cost)")
        if node.get("type") == "string" and "maxLength" not in node and "enum" not in node \
                and node.get("format") != "date-time":
            problems.append(f"{path}: string without maxLength (CEL cost)")
    assert problems == []


def test_printer_columns_point_at_schema_fields() -> None:
    props = walk_properties(_schema())
    for col in PRINTER_COLUMNS:
        path = col["jsonPath"].lstrip(".").split("[")[0].rstrip(".")
        if path.startswith("metadata"):
            continue
        assert path in props, col


def test_scale_subresource_points_at_schema_fields() -> None:
    version = crd()["spec"]["versions"][0]
    scale = version["subresources"]["scale"]
    props = walk_properties(_schema())
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert scale[key].lstrip(".") in props


def test_crd_names() -> None:
    names = crd()["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("InferenceEngine", "inferenceengines", ["ie"])
    assert yaml.safe_load(render_crd_yaml())["spec"]["group"] == "serving.kvpilot.io"


def test_cross_field_rules_are_declared() -> None:
    rules = [r["rule"] for s in walk_properties(_schema()).values() for r in s.get("x-kubernetes-validations", [])]
    rules += [r["rule"] for r in _schema()["properties"]["spec"].get("x-kubernetes-validations", [])]
    text = "\n".join(rules)
    for needle in ("self.batching.maxBatchSize <= self.build.maxBatchSize", "self.maxInputLen < self.maxSeqLen",
                   "self.minBatchSize <= self.maxBatchSize", "self.build.kvCache.type == 'paged'",
                   "self.batching.maxNumTokens <= self.build.maxNumTokens", "[2, 4, 8, 16, 32, 64, 128]"):
        assert needle in text, needle


def test_simulation_profiles_are_kvsims() -> None:
    """The CRD's enum of simulated profiles is what kvsim can serve (kept apart: the operator never imports it)."""
    from kvsim import PROFILES

    from kvpilot.api.enums import SIMULATION_PROFILES

    assert set(SIMULATION_PROFILES) == set(PROFILES)
