"""The tenant policy (values: tenantPolicy): a ValidatingAdmissionPolicy and its binding that limit the pod fields
a tenant sets on an InferenceEngine (issue 22, item 4).

The rendered CEL is evaluated here with cel-python over a table of requests (create and update, tenant and
exempt users), the way the API server evaluates a policy: match conditions, then the variables, then each
validation, whose messageExpression (or message) is what the user reads. tests/e2e/test_tenancy_policy.py runs
the same policy on a real kube-apiserver, where it is also type-checked against the CRD's schema.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from chart_helpers import Manifest, objects_of_kind, only_object

POLICY = "kvpilot-tenant-policy"
TENANT = {"username": "alice", "groups": ["team-a", "system:authenticated"]}
ADMIN = {"username": "root", "groups": ["system:masters", "system:authenticated"]}


def engine(**serving: Any) -> dict[str, Any]:
    image = serving.pop("image", None)
    spec: dict[str, Any] = {"model": {"source": "hf://org/m", "revision": "r"}, "runtime": {"backend": "simulated"},
                            "serving": serving}
    if image:
        spec["runtime"]["image"] = image
    return {"apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine",
            "metadata": {"name": "e", "namespace": "team-a"}, "spec": spec}


def cel(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def admit(policy: Manifest, obj: dict[str, Any], old: dict[str, Any] | None = None,
          user: dict[str, Any] = TENANT) -> list[str]:
    """The messages of the validations ``obj`` fails under ``policy`` (empty: admitted)."""
    spec = policy["spec"]
    request = {"operation": "UPDATE" if old is not None else "CREATE", "userInfo": user}
    activation: dict[str, Any] = {"object": json_to_cel(obj), "oldObject": json_to_cel(old),
                                  "request": json_to_cel(request)}
    if not all(cel(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = cel(variable["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    refused = []
    for validation in spec["validations"]:
        if not cel(validation["expression"], activation):
            expression = validation.get("messageExpression")
            refused.append(str(cel(expression, activation)) if expression else validation["message"])
    return refused


@pytest.fixture(scope="module")
def default_policy(render) -> Manifest:
    return only_object(render(), "ValidatingAdmissionPolicy")


def test_the_defaults_install_a_denying_policy_bound_to_every_namespace(render) -> None:
    objects = render()
    policy = only_object(objects, "ValidatingAdmissionPolicy")
    binding = only_object(objects, "ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["serving.kvpilot.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                    "resources": ["inferenceengines"]}  # not the status subresource the operator writes
    assert all(v["reason"] == "Forbidden" for v in policy["spec"]["validations"])


@pytest.mark.parametrize("priority_class", ["system-node-critical", "system-cluster-critical", "system-x"])
def test_system_priority_classes_are_refused_naming_the_field_and_the_policy(default_policy, priority_class) -> None:
    (message,) = admit(default_policy, engine(priorityClassName=priority_class))
    assert message == (f"spec.serving.priorityClassName {priority_class} is refused by the kvpilot tenant policy "
                       f"{POLICY} (priority classes allowed: none; denied: system-*)")


def test_a_blanket_toleration_is_refused_and_a_keyed_one_is_not(default_policy) -> None:
    (message,) = admit(default_policy, engine(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"},
                                                            {"operator": "Exists"}]))
    assert message.startswith("spec.serving.tolerations: a toleration without a key (operator Exists) tolerates "
                              f"every taint and is refused by the kvpilot tenant policy {POLICY}")
    assert admit(default_policy, engine(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])) == []
    (message,) = admit(default_policy, engine(tolerations=[{"key": "node-role.kubernetes.io/control-plane",
                                                            "operator": "Exists", "effect": "NoSchedule"}]))
    assert "the taint key node-role.kubernetes.io/control-plane is refused" in message


def test_an_ordinary_engine_passes_and_the_exempt_group_is_not_checked(default_policy) -> None:
    allowed = engine(priorityClassName="team-a-high", tolerations=[{"key": "dedicated", "value": "team-a"}],
                     nodeSelector={"pool": "a"}, image="registry.example.com/ml/trtllm:1.2.0")
    assert admit(default_policy, allowed) == []
    assert admit(default_policy, engine()) == []
    critical = engine(priorityClassName="system-node-critical", tolerations=[{"operator": "Exists"}])
    assert len(admit(default_policy, critical)) == 2
    assert admit(default_policy, critical, user=ADMIN) == []


def test_on_update_only_what_changed_is_checked(default_policy) -> None:
    """An engine admitted before the policy (or by an exempt admin) can still be labelled, scaled and finalized;
    adding a refused value, or changing to one, is refused."""
    old = engine(priorityClassName="system-node-critical", tolerations=[{"operator": "Exists"}])
    labelled = copy.deepcopy(old)
    labelled["metadata"]["labels"] = {"x": "y"}
    labelled["spec"]["serving"]["replicas"] = 3
    assert admit(default_policy, labelled, old=old) == []
    more = copy.deepcopy(old)
    more["spec"]["serving"]["tolerations"].append({"key": "node-role.kubernetes.io/master", "operator": "Exists"})
    (message,) = admit(default_policy, more, old=old)
    assert "node-role.kubernetes.io/master" in message
    changed = engine(priorityClassName="system-cluster-critical", tolerations=[{"operator": "Exists"}])
    (message,) = admit(default_policy, changed, old=old)
    assert "system-cluster-critical" in message
    assert len(admit(default_policy, old, old=engine())) == 2  # the values appear in an update: checked


ALLOW_LISTS = {"tenantPolicy": {
    "priorityClassNames": {"allowed": ["team-a-high", "batch-*"]},
    "tolerations": {"allowedKeys": ["nvidia.com/gpu", "dedicated"], "deniedKeys": []},
    "nodeSelector": {"allowedKeys": ["pool", "topology.kubernetes.io/*"], "deniedKeys": ["pool-secret*"]},
    "images": {"allowedRepositories": ["nvcr.io/nvidia/tensorrt-llm/release", "registry.example.com/ml/*"],
               "deniedRepositories": ["registry.example.com/ml/legacy"]},
}}


@pytest.fixture(scope="module")
def strict_policy(render) -> Manifest:
    return only_object(render(ALLOW_LISTS), "ValidatingAdmissionPolicy")


@pytest.mark.parametrize(("serving", "refused"), [
    ({"priorityClassName": "team-a-high"}, None),
    ({"priorityClassName": "batch-low"}, None),
    ({"priorityClassName": "team-b-high"}, "spec.serving.priorityClassName team-b-high is refused"),
    ({"priorityClassName": "system-node-critical"}, "spec.serving.priorityClassName system-node-critical"),
    ({"tolerations": [{"key": "dedicated", "value": "team-a"}]}, None),
    ({"tolerations": [{"key": "team-b-only", "operator": "Exists"}]}, "the taint key team-b-only is refused"),
    ({"nodeSelector": {"pool": "a", "topology.kubernetes.io/zone": "z1"}}, None),
    ({"nodeSelector": {"kubernetes.io/hostname": "n1"}}, "the label key kubernetes.io/hostname is refused"),
    ({"image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"}, None),
    ({"image": "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "a" * 64}, None),
    ({"image": "nvcr.io/nvidia/tensorrt-llm/release"}, None),
    ({"image": "registry.example.com/ml/team-a/trtllm:2"}, None),
    ({"image": "nvcr.io/nvidia/tensorrt-llm/release-evil:1"}, "spec.runtime.image nvcr.io/nvidia/tensorrt-llm/"),
    ({"image": "nvcr.io/nvidia/tensorrt-llm/release:1/../../x"}, "is refused"),
    ({"image": "docker.io/attacker/miner:latest"}, "spec.runtime.image docker.io/attacker/miner:latest is refused"),
    ({"image": "registry.example.com/ml/legacy:1"}, "registry.example.com/ml/legacy:1 is refused"),
    ({"image": "nvcr.io.evil.com/nvidia/tensorrt-llm/release:1"}, "is refused"),
])
def test_allow_and_deny_lists_of_every_field(strict_policy, serving: dict[str, Any], refused: str | None) -> None:
    messages = admit(strict_policy, engine(**serving))
    if refused is None:
        assert messages == []
    else:
        (message,) = messages
        assert refused in message and f"by the kvpilot tenant policy {POLICY} (" in message


def test_the_refusal_names_the_lists_in_force(strict_policy) -> None:
    (message,) = admit(strict_policy, engine(image="quay.io/x/y:1"))
    assert message.endswith("(repositories allowed: nvcr.io/nvidia/tensorrt-llm/release, registry.example.com/ml/*; "
                            "denied: registry.example.com/ml/legacy)")


def test_switches_and_scope(render, render_result) -> None:
    assert objects_of_kind(render({"tenantPolicy": {"enabled": False}}), "ValidatingAdmissionPolicy") == []
    permissive = {"tenantPolicy": {"priorityClassNames": {"denied": []},
                                   "tolerations": {"allowEmptyKey": True, "deniedKeys": []}}}
    assert objects_of_kind(render(permissive), "ValidatingAdmissionPolicy") == []  # nothing to check: no policy
    objects = render({"tenantPolicy": {"tolerations": {"allowEmptyKey": True}, "exemptGroups": [],
                                       "validationActions": ["Warn", "Audit"],
                                       "namespaceSelector": {"matchLabels": {"kvpilot.io/tenant": "true"}}}})
    policy = only_object(objects, "ValidatingAdmissionPolicy")
    binding = only_object(objects, "ValidatingAdmissionPolicyBinding")
    assert "matchConditions" not in policy["spec"]
    assert all("without a key" not in v["message"] for v in policy["spec"]["validations"])
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchLabels": {"kvpilot.io/tenant": "true"}}}
    assert admit(policy, engine(priorityClassName="system-node-critical"), user=ADMIN) != []  # no group exempt


def test_kubernetes_without_validating_admission_policy_v1_is_told_why(render_result) -> None:
    result = render_result(kube_version="1.29.5")
    assert result.returncode != 0 and "tenantPolicy needs Kubernetes 1.30" in result.stderr
    assert render_result({"tenantPolicy": {"enabled": False}}, kube_version="1.29.5").returncode == 0


@pytest.mark.parametrize("values", [
    {"tenantPolicy": {"validationActions": ["Block"]}},
    {"tenantPolicy": {"priorityClassNames": {"denied": ["System Critical"]}}},
    {"tenantPolicy": {"priorityClassNames": {"denied": ['x") || true || ("']}}},
    {"tenantPolicy": {"tolerations": {"allowedKeys": ["a*b"]}}},
    {"tenantPolicy": {"images": {"allowedRepositories": ["nvcr.io/x@sha256:abc"]}}},
    {"tenantPolicy": {"imagez": {}}},
])
def test_the_values_schema_refuses_malformed_policy_values(render_result, values) -> None:
    result = render_result(values)
    assert result.returncode != 0 and "tenantPolicy" in result.stderr, result.stderr
