"""The operator's RBAC as rendered: exactly the permissions it needs, no wildcards, in both modes.

The tables in rbac_contract.py are the contract the operator is written against (docs/install.md has the
reason for each line). An exact comparison makes least privilege testable: a permission added to the
chart without adding it here (and to the docs) fails, and so does one that goes missing.
"""

from __future__ import annotations

import pytest
from chart_helpers import RELEASE_NAMESPACE, Manifest, objects_of_kind, only_object
from chart_policies import effective_permissions, wildcard_uses
from rbac_contract import (
    CLUSTER_WIDE_MODE_GRANTS,
    KOPF_CLUSTER_READS,
    NAMESPACED_MODE_CLUSTER_GRANTS,
    NAMESPACED_NEEDS,
    WRITE_VERBS,
)


def service_account(objects: list[Manifest]) -> tuple[str, str]:
    account = only_object(objects, "ServiceAccount")["metadata"]
    return account["name"], account["namespace"]


def test_no_rule_uses_a_wildcard(variant_objects: list[Manifest]) -> None:
    roles = objects_of_kind(variant_objects, "ClusterRole") + objects_of_kind(variant_objects, "Role")
    assert roles
    for role in roles:
        assert wildcard_uses(role) == [], f"{role['kind']}/{role['metadata']['name']}"


def test_cluster_wide_grants_exactly_what_the_operator_needs(render) -> None:
    objects = render()
    granted = effective_permissions(objects, *service_account(objects))
    assert granted == {None: CLUSTER_WIDE_MODE_GRANTS}
    assert objects_of_kind(objects, "Role") == []


def test_without_the_gpu_capacity_watch_no_node_or_cluster_pod_read(render) -> None:
    objects = render({"gpuCapacity": {"watch": False}})
    granted = effective_permissions(objects, *service_account(objects))
    assert granted == {None: {**NAMESPACED_NEEDS, **KOPF_CLUSTER_READS}}
    namespaced = render({"gpuCapacity": {"watch": False}, "watchNamespaces": ["team-a"]})
    cluster_reads = effective_permissions(namespaced, *service_account(namespaced))[None]
    assert ("", "nodes") not in cluster_reads and ("", "pods") not in cluster_reads
    args = only_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-gpu-capacity" in args


@pytest.mark.parametrize("namespaces", [["team-a"], ["team-a", "team-b", "team-c"]])
def test_namespaced_grants_roles_per_namespace_and_only_cluster_reads(render, namespaces: list[str]) -> None:
    objects = render({"watchNamespaces": namespaces})
    granted = effective_permissions(objects, *service_account(objects))
    expected: dict[str | None, dict] = {ns: NAMESPACED_NEEDS for ns in namespaces}
    expected[None] = NAMESPACED_MODE_CLUSTER_GRANTS
    assert granted == expected
    roles = objects_of_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    bindings = objects_of_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)


def test_namespaced_mode_has_no_cluster_wide_write(render) -> None:
    objects = render(ci_files=("namespaced-values.yaml",))
    cluster_grants = effective_permissions(objects, *service_account(objects))[None]
    for (group, resource), verbs in cluster_grants.items():
        assert not verbs & WRITE_VERBS, f"cluster-wide {sorted(verbs & WRITE_VERBS)} on {group}/{resource}"
    # No ClusterRole bound to the operator may mention the API group it writes.
    bound = {b["roleRef"]["name"] for b in objects_of_kind(objects, "ClusterRoleBinding")}
    for role in objects_of_kind(objects, "ClusterRole"):
        if role["metadata"]["name"] in bound:
            assert all("serving.kvpilot.io" not in rule["apiGroups"] for rule in role["rules"])


def test_operator_may_not_touch_secrets_or_rbac(variant_objects: list[Manifest]) -> None:
    granted = effective_permissions(variant_objects, *service_account(variant_objects))
    for perms in granted.values():
        for (group, resource), verbs in perms.items():
            if resource == "secrets":  # multi-node engines' SSH keys: created once, never read
                assert verbs == {"create"}, "the operator reads no Secret: pods mount them"
            assert group != "rbac.authorization.k8s.io"


def test_rbac_create_false_renders_no_roles(render) -> None:
    objects = render({"rbac": {"create": False}})
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert objects_of_kind(objects, kind) == [], kind


def test_aggregated_user_roles_are_not_bound_to_the_operator(render) -> None:
    objects = render()
    aggregated = [
        r
        for r in objects_of_kind(objects, "ClusterRole")
        if any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in r["metadata"]["labels"])
    ]
    assert {r["metadata"]["name"] for r in aggregated} == {"kvpilot-view", "kvpilot-edit"}
    bound = {b["roleRef"]["name"] for b in objects_of_kind(objects, "ClusterRoleBinding")}
    assert not bound & {r["metadata"]["name"] for r in aggregated}
    edit = next(r for r in aggregated if r["metadata"]["name"] == "kvpilot-edit")
    assert any("inferenceengines/scale" in rule["resources"] and "update" in rule["verbs"] for rule in edit["rules"])
    without = render({"rbac": {"aggregateToDefaultRoles": False}})
    assert {r["metadata"]["name"] for r in objects_of_kind(without, "ClusterRole")} == {"kvpilot"}


def test_bindings_name_the_release_namespace(variant_objects: list[Manifest]) -> None:
    for binding in objects_of_kind(variant_objects, "ClusterRoleBinding") + objects_of_kind(
        variant_objects, "RoleBinding"
    ):
        for subject in binding["subjects"]:
            assert subject["namespace"] == RELEASE_NAMESPACE
