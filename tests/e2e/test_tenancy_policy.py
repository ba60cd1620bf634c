"""The chart's tenant policy on a real kube-apiserver (issue 22, item 4): a tenant holding only the `kvpilot-edit`
role in a namespace is refused `system-node-critical` and a blanket toleration, with a message naming the field
and the policy; an allowed spec passes; an update is checked on what it changes; and allow lists set in values
hold for images and node selectors. The policy installed is the chart's, by the session's `helm upgrade --install`
(tests/e2e/conftest.py); the API server type-checks its CEL against the CRD's schema, and that must be clean."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hack.testenv import cluster
from tests.cases.engines import base
from tests.e2e.conftest import ROOT, kubectl, run_kubectl, wait_for

POLICY = "kvpilot-tenant-policy"
EDIT_ROLE = "kvpilot-edit"  # the chart's aggregated ClusterRole (release "kvpilot")


class Tenant:
    """A user who holds only kvpilot-edit in one namespace (impersonated: RBAC and the policy see that user)."""

    def __init__(self, namespace: str, user: str) -> None:
        self.namespace, self.user = namespace, user

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_kubectl(f"--as={self.user}", "-n", self.namespace, *args, stdin=stdin)

    def create(self, doc: dict[str, Any], dry_run: bool = False) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", *(["--dry-run=server"] if dry_run else []), "-f", "-",
                            stdin=yaml.safe_dump(doc))

    def patch(self, name: str, patch: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """A merge PATCH as the tenant (kubectl patch would GET first, which kvpilot-edit alone does not grant);
        returns what kubectl would: the exit status, and the API server's message on stderr."""
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(cluster.kubeconfig_path()), client_configuration=configuration)
        with k8s_client.ApiClient(configuration) as api:
            api.set_default_header("Impersonate-User", self.user)
            try:
                k8s_client.CustomObjectsApi(api).patch_namespaced_custom_object(
                    "serving.kvpilot.io", "v1alpha1", self.namespace, "inferenceengines", name, patch,
                    _content_type="application/merge-patch+json")
            except ApiException as exc:
                message = json.loads(exc.body or "{}").get("message", str(exc))
                return subprocess.CompletedProcess(["patch", name], 1, "", message)
        return subprocess.CompletedProcess(["patch", name], 0, "patched", "")


def engine(name: str, namespace: str, **serving: Any) -> dict[str, Any]:
    doc = base(name)
    doc["metadata"]["namespace"] = namespace
    image = serving.pop("image", None)
    if image:
        doc["spec"]["runtime"]["image"] = image
    doc["spec"]["serving"].update(serving)
    return doc


@pytest.fixture(scope="module")
def tenant(chart: str) -> Iterator[Tenant]:
    suffix = uuid.uuid4().hex[:6]
    namespace, user = f"tenancy-{suffix}", f"tenant-{suffix}"
    kubectl("create", "namespace", namespace)
    kubectl("create", "rolebinding", "tenant-edit", f"--clusterrole={EDIT_ROLE}", f"--user={user}", "-n", namespace)
    who = Tenant(namespace, user)
    # The API server loads a new or changed policy within a few seconds: wait until it refuses.
    wait_for(lambda: who.create(engine("probe", namespace, priorityClassName="system-node-critical"),
                                dry_run=True).returncode != 0, 60, "the tenant policy to take effect")
    yield who
    kubectl("delete", "namespace", namespace, "--wait=false")


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request" in result.stderr, result.stderr
    return result.stderr


def test_the_tenant_holds_only_kvpilot_edit(tenant: Tenant) -> None:
    def can(verb: str, resource: str) -> bool:
        return tenant.kubectl("auth", "can-i", verb, resource).stdout.strip() == "yes"

    assert can("create", "inferenceengines.serving.kvpilot.io") and can("patch", "inferenceengines.serving.kvpilot.io")
    assert not can("create", "deployments.apps") and not can("create", "pods") and not can("get", "secrets")


def test_the_policy_type_checks_against_the_crd_without_warnings(tenant: Tenant) -> None:
    def checked() -> dict[str, Any] | None:
        policy = json.loads(kubectl("get", "validatingadmissionpolicy", POLICY, "-o", "json"))
        status = policy.get("status") or {}
        done = status.get("observedGeneration") == policy["metadata"]["generation"] and "typeChecking" in status
        return status if done else None

    status = wait_for(checked, 60, "the API server to type-check the policy")
    assert status["typeChecking"].get("expressionWarnings", []) == []


def test_system_node_critical_is_refused_naming_the_field_and_the_policy(tenant: Tenant) -> None:
    stderr = refusal(tenant.create(engine("critical", tenant.namespace, priorityClassName="system-node-critical")))
    assert ("spec.serving.priorityClassName system-node-critical is refused by the kvpilot tenant policy "
            f"{POLICY}") in stderr


def test_a_blanket_toleration_is_refused_naming_the_field_and_the_policy(tenant: Tenant) -> None:
    stderr = refusal(tenant.create(engine("blanket", tenant.namespace, tolerations=[{"operator": "Exists"}])))
    assert ("spec.serving.tolerations: a toleration without a key (operator Exists) tolerates every taint and is "
            f"refused by the kvpilot tenant policy {POLICY}") in stderr


def test_an_allowed_spec_passes_and_an_update_is_checked_on_what_it_changes(tenant: Tenant) -> None:
    allowed = engine("allowed", tenant.namespace, priorityClassName="team-a-high", replicas=1,
                     tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     nodeSelector={"pool": "team-a"})
    created = tenant.create(allowed)
    assert created.returncode == 0, created.stderr
    assert tenant.patch("allowed", {"spec": {"serving": {"replicas": 2}}}).returncode == 0
    stderr = refusal(tenant.patch("allowed", {"spec": {"serving": {"priorityClassName": "system-cluster-critical"}}}))
    assert "spec.serving.priorityClassName system-cluster-critical" in stderr
    refusal(tenant.patch("allowed", {"spec": {"serving": {"tolerations": [{"operator": "Exists"}]}}}))


def test_an_engine_admitted_before_the_policy_can_still_be_changed_where_it_complies(tenant: Tenant) -> None:
    """An exempt administrator (system:masters) creates what the policy refuses tenants, as an engine created
    before the policy would be; the tenant can still scale and label it, but not add another refused value."""
    kubectl("create", "-f", "-", stdin=yaml.safe_dump(
        engine("grandfathered", tenant.namespace, priorityClassName="system-node-critical",
               tolerations=[{"operator": "Exists"}])))
    assert tenant.patch("grandfathered", {"metadata": {"labels": {"team": "a"}},
                                          "spec": {"serving": {"replicas": 2}}}).returncode == 0
    stderr = refusal(tenant.patch("grandfathered", {"spec": {"serving": {"tolerations": [
        {"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}}}))
    assert "the taint key node-role.kubernetes.io/control-plane is refused" in stderr


def test_allow_lists_from_values_hold_for_images_node_selectors_and_priority_classes(tenant: Tenant) -> None:
    """The same template with allow lists, rendered under another release and bound to the tenant's namespace
    only, next to the session's policy."""
    values = {"tenantPolicy": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": tenant.namespace}},
        "priorityClassNames": {"allowed": ["team-a-*"]},
        "nodeSelector": {"allowedKeys": ["pool"]},
        "images": {"allowedRepositories": ["nvcr.io/nvidia/tensorrt-llm/release", "registry.example.com/team-a/*"]},
    }}
    rendered = cluster.helm("template", "strict", str(ROOT / "charts/kvpilot"), "--show-only",
                            "templates/tenant-policy.yaml", "-f", "-", stdin=yaml.safe_dump(values))
    strict = "strict-kvpilot-tenant-policy"
    kubectl("apply", "-f", "-", stdin=rendered)
    try:
        def refused(**serving: Any) -> subprocess.CompletedProcess[str]:
            return tenant.create(engine("strict", tenant.namespace, **serving), dry_run=True)

        wait_for(lambda: refused(image="docker.io/attacker/miner:1").returncode != 0, 60, "the strict policy")
        result = refused(image="docker.io/attacker/miner:1")
        assert f"ValidatingAdmissionPolicy '{strict}'" in result.stderr
        assert "spec.runtime.image docker.io/attacker/miner:1 is refused" in result.stderr
        assert refused(image="nvcr.io/nvidia/tensorrt-llm/release:1.2.0").returncode == 0
        assert refused(image="registry.example.com/team-a/trtllm:2").returncode == 0
        assert "the label key kubernetes.io/hostname is refused" in refused(
            nodeSelector={"kubernetes.io/hostname": "gpu-h100-0"}).stderr
        assert "spec.serving.priorityClassName team-b-high is refused" in refused(priorityClassName="team-b-high").stderr
        assert refused(priorityClassName="team-a-high", nodeSelector={"pool": "a"}).returncode == 0
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=rendered)
