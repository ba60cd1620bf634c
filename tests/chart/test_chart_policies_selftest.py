"""The checkers in chart_policies.py catch what they claim to: without this, a checker that always
returned "fine" would make the chart tests pass for the wrong reason."""

from __future__ import annotations

from chart_policies import effective_permissions, wildcard_uses


def test_wildcards_are_found_in_every_field() -> None:
    role = {
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["*"], "resources": ["x"], "verbs": ["*"]},
        ]
    }
    assert wildcard_uses(role) == ["rule 1 apiGroups=['*']", "rule 1 verbs=['*']"]


def test_effective_permissions_follow_binding_scope() -> None:
    rules = [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}]
    subject = [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    other = [{"kind": "ServiceAccount", "name": "someone", "namespace": "ops"}]
    objects = [
        {"kind": "ClusterRole", "metadata": {"name": "cr"}, "rules": rules},
        {"kind": "Role", "metadata": {"name": "r", "namespace": "a"}, "rules": rules},
        {
            "kind": "RoleBinding",
            "metadata": {"name": "rb", "namespace": "a"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": subject,
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "rb2", "namespace": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "cr"},
            "subjects": subject,
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "crb"},
            "roleRef": {"kind": "ClusterRole", "name": "cr"},
            "subjects": other,
        },
    ]
    granted = effective_permissions(objects, "op", "ops")
    assert granted == {
        "a": {("apps", "deployments"): frozenset({"get"})},
        "b": {("apps", "deployments"): frozenset({"get"})},
    }
