"""The checkers in chart_policies.py catch what they claim to: without this, a checker that always
returned "fine" would make the chart tests pass for the wrong reason."""

from __future__ import annotations

import copy

import pytest
from chart_policies import effective_permissions, restricted_violations, wildcard_uses

GOOD_POD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
            },
        }
    ],
    "volumes": [{"name": "tmp", "emptyDir": {}}],
}


def with_change(path: list, value) -> dict:
    pod = copy.deepcopy(GOOD_POD)
    target = pod
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return pod


def test_a_good_pod_passes() -> None:
    assert restricted_violations(GOOD_POD) == []


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (["hostNetwork"], True, "hostNetwork"),
        (["securityContext", "runAsNonRoot"], False, "runAsNonRoot"),
        (["securityContext", "runAsUser"], 0, "runAsUser"),
        (["securityContext", "seccompProfile"], {"type": "Unconfined"}, "seccompProfile"),
        (["containers", 0, "securityContext", "allowPrivilegeEscalation"], True, "allowPrivilegeEscalation"),
        (["containers", 0, "securityContext", "privileged"], True, "privileged"),
        (["containers", 0, "securityContext", "capabilities"], {"drop": ["NET_RAW"]}, "drop must include ALL"),
        (["containers", 0, "securityContext", "capabilities"], {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "SYS_ADMIN"),
        (["containers", 0, "securityContext", "readOnlyRootFilesystem"], False, "readOnlyRootFilesystem"),
        (["containers", 0, "ports"], [{"containerPort": 80, "hostPort": 80}], "hostPort"),
        (["volumes"], [{"name": "host", "hostPath": {"path": "/"}}], "hostPath"),
    ],
)
def test_each_restricted_rule_is_enforced(path: list, value, complaint: str) -> None:
    problems = restricted_violations(with_change(path, value))
    assert any(complaint in p for p in problems), problems


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
