"""The InferenceEngine CRD in the chart: a template (so `helm upgrade` upgrades it), kept on uninstall,
switchable off, and the same file as the repository's crds/."""

from __future__ import annotations

import pytest
import yaml
from chart_helpers import CHART_DIR, REPO_ROOT, Manifest, objects_of_kind, only_object

CRD_NAME = "inferenceengines.serving.kvpilot.io"
CHART_CRD = CHART_DIR / "files" / "crds" / "serving.kvpilot.io_inferenceengines.yaml"
REPO_CRD = REPO_ROOT / "crds" / "serving.kvpilot.io_inferenceengines.yaml"


def rendered_crd(objects: list[Manifest]) -> Manifest:
    crd = only_object(objects, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == CRD_NAME
    return crd


def test_crd_is_rendered_with_resource_policy_keep(render) -> None:
    crd = rendered_crd(render())
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crd_names_and_subresources_match_the_api(render) -> None:
    crd = rendered_crd(render())
    spec = crd["spec"]
    assert spec["group"] == "serving.kvpilot.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "InferenceEngine"
    assert spec["names"]["plural"] == "inferenceengines"
    assert "ie" in spec["names"]["shortNames"]
    served = {v["name"]: v for v in spec["versions"] if v["served"]}
    assert "v1alpha1" in served
    assert sum(1 for v in spec["versions"] if v["storage"]) == 1
    subresources = served["v1alpha1"]["subresources"]
    assert "status" in subresources
    assert {"specReplicasPath", "statusReplicasPath"} <= set(subresources["scale"])


def test_crd_spec_is_the_file_unchanged(render) -> None:
    """The template only adds metadata: the schema must reach the cluster exactly as generated."""
    source = yaml.safe_load(CHART_CRD.read_text())
    crd = rendered_crd(render())
    assert crd["spec"] == source["spec"]
    assert crd["apiVersion"] == source["apiVersion"] == "apiextensions.k8s.io/v1"


def test_crd_can_be_turned_off(render) -> None:
    objects = render({"crds": {"install": False}})
    assert objects_of_kind(objects, "CustomResourceDefinition") == []
    assert objects_of_kind(objects, "Deployment"), "the operator still installs"


def test_keep_off_removes_the_policy_even_if_the_generated_file_has_it(render) -> None:
    crd = rendered_crd(render({"crds": {"keep": False}}))
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})


def test_keep_can_be_turned_off_and_annotations_added(render) -> None:
    crd = rendered_crd(
        render({"crds": {"keep": False, "annotations": {"argocd.argoproj.io/sync-options": "ServerSideApply=true"}}})
    )
    annotations = crd["metadata"]["annotations"]
    assert "helm.sh/resource-policy" not in annotations
    assert annotations["argocd.argoproj.io/sync-options"] == "ServerSideApply=true"


def test_chart_has_no_crds_directory() -> None:
    """A crds/ directory would be installed before the templates and then clash with the templated CRD
    ("exists and cannot be imported into the current release"). The copy belongs in files/crds/."""
    assert not (CHART_DIR / "crds").exists(), (
        "move charts/kvpilot/crds/* to charts/kvpilot/files/crds/ (see docs/install.md)"
    )


def test_chart_crd_matches_the_repository_crd() -> None:
    if not REPO_CRD.exists():
        pytest.skip(f"{REPO_CRD.relative_to(REPO_ROOT)} is not generated yet (make crds)")
    assert CHART_CRD.read_bytes() == REPO_CRD.read_bytes(), (
        "charts/kvpilot/files/crds/ is out of date with crds/: run `make crds`"
    )
