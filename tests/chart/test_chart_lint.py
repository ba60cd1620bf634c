"""Chart hygiene: `helm lint --strict` for every values set, documented values, a schema that rejects
mistakes, the Kubernetes floor, and the recommended labels on every object."""

from __future__ import annotations

import re

import pytest
import yaml
from chart_helpers import CHART_DIR, KUBE_VERSION, VARIANTS, Manifest

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):(?: |$)")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(helm, variant: str) -> None:
    args = ["lint", "--strict", str(CHART_DIR), "--kube-version", KUBE_VERSION]
    for name in VARIANTS[variant]:
        args += ["--values", str(CHART_DIR / "ci" / name)]
    result = helm.run(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def undocumented_keys(values_text: str) -> list[str]:
    """Keys of a values.yaml whose comment block above does not start with '# <key>'."""
    lines = values_text.splitlines()
    missing = []
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match:
            continue
        comments = []
        back = number - 1
        while back >= 0 and lines[back].strip().startswith("#"):
            comments.insert(0, lines[back].strip())
            back -= 1
        key = match.group("key")
        if not comments or not re.match(rf"#\s+{re.escape(key)}\b", comments[0]):
            missing.append(f"line {number + 1}: {key}")
    return missing


def test_undocumented_keys_detector_works() -> None:
    text = "# a is documented\na: 1\nb: 2\n# about something else\nc: 3\nd:\n  # e is documented\n  e: 4\n"
    assert undocumented_keys(text) == ["line 3: b", "line 5: c", "line 6: d"]


def test_every_value_is_documented_by_name() -> None:
    assert undocumented_keys((CHART_DIR / "values.yaml").read_text()) == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": 3}, "replicaCount"),
        ({"logFormat": "xml"}, "logFormat"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"metrics": {"port": 70000}}, "port"),
        ({"wachNamespaces": ["typo"]}, "wachNamespaces"),
    ],
)
def test_schema_rejects_bad_values(render_result, values: dict, complaint: str) -> None:
    result = render_result(values)
    assert result.returncode != 0, f"{values} was accepted"
    assert complaint in result.stderr


def test_kubernetes_older_than_1_29_is_refused(render_result) -> None:
    result = render_result(kube_version="1.28.9")
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[\w.]+)?", str(chart["version"])), "version must be SemVer"
    assert chart["appVersion"]
    assert chart["kubeVersion"].startswith(">=1.29")


def test_every_object_has_the_recommended_labels(variant_objects: list[Manifest]) -> None:
    for obj in variant_objects:
        labels = obj["metadata"].get("labels") or {}
        missing = [label for label in RECOMMENDED_LABELS if label not in labels]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"


def test_namespaced_objects_name_their_namespace(variant_objects: list[Manifest]) -> None:
    """`helm template | kubectl apply` and GitOps tools need explicit namespaces on namespaced objects."""
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}
    for obj in variant_objects:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace"), f"{obj['kind']}/{obj['metadata']['name']}"
