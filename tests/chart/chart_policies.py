"""Pure checks the chart tests apply to rendered objects: where pods are, and effective RBAC.

They are plain functions of manifests (no helm, no cluster), so test_chart_policies_selftest.py can
prove each one catches what it claims to catch on hand-made bad objects. Pod Security "restricted" is not
re-implemented here: the API server's own admission judges every variant (test_chart_install_e2e.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Manifest = dict[str, Any]

POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"})


def pod_specs(objects: Iterable[Manifest]) -> list[tuple[str, Mapping[str, Any]]]:
    """(kind/name, pod spec) of every object that runs pods, including CronJobs and bare Pods."""
    found = []
    for obj in objects:
        kind, name = obj.get("kind"), obj.get("metadata", {}).get("name")
        if kind in POD_TEMPLATE_KINDS:
            found.append((f"{kind}/{name}", obj["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            found.append((f"{kind}/{name}", obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
        elif kind == "Pod":
            found.append((f"{kind}/{name}", obj["spec"]))
    return found


# (apiGroup, resource) -> verbs; a scope is a namespace name, or None for cluster-wide.
Permissions = dict[tuple[str, str], frozenset[str]]
ScopedPermissions = dict[str | None, Permissions]


def _subject_matches(subject: Mapping[str, Any], sa_name: str, sa_namespace: str) -> bool:
    return (
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == sa_name
        and subject.get("namespace") == sa_namespace
    )


def effective_permissions(objects: Iterable[Manifest], sa_name: str, sa_namespace: str) -> ScopedPermissions:
    """What the ServiceAccount may do, by scope, from the (Cluster)Roles and bindings among `objects`.

    Follows bindings exactly as the RBAC authorizer does: a ClusterRoleBinding grants its ClusterRole
    everywhere; a RoleBinding grants its Role or ClusterRole in the binding's namespace only.
    Aggregated ClusterRoles are not expanded (the chart's aggregate roles are never bound to the operator).
    """
    objects = list(objects)
    cluster_roles = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ClusterRole"}
    roles = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects if o.get("kind") == "Role"}
    grants: dict[str | None, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(_subject_matches(s, sa_name, sa_namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        scope = None if kind == "ClusterRoleBinding" else binding["metadata"].get("namespace")
        if ref["kind"] == "ClusterRole":
            role = cluster_roles.get(ref["name"])
        else:
            role = roles.get((scope, ref["name"]))
        assert role is not None, (
            f"{kind}/{binding['metadata']['name']} refers to {ref['kind']}/{ref['name']}, which the chart does not render"
        )
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    grants[scope][(group, resource)].update(rule.get("verbs") or [])
    return {scope: {key: frozenset(verbs) for key, verbs in perms.items()} for scope, perms in grants.items()}


def wildcard_uses(role: Mapping[str, Any]) -> list[str]:
    """Each '*' in a (Cluster)Role's rules, as 'rule N field'."""
    found = []
    for index, rule in enumerate(role.get("rules") or []):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            if any("*" in str(value) for value in rule.get(field) or []):
                found.append(f"rule {index} {field}={rule[field]}")
    return found
