"""The chart on a real API server: `helm install` into a namespace that enforces Pod Security
"restricted", the operator's permissions as the RBAC authorizer decides them (both modes, compared
exactly with rbac_contract.py), `helm upgrade` upgrading the CRD, and `helm uninstall` keeping it.

It starts a private control plane (hack/testenv/cluster-up.sh with its own state directory) instead
of the shared one, because it installs and removes cluster-scoped objects (the CRD, ClusterRoles) that
the end-to-end suite's own release owns. The tests run in file order: each step builds on the last.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART_DIR, REPO_ROOT, VARIANTS
from chart_policies import pod_specs
from rbac_contract import (
    CLUSTER_WIDE_MODE_GRANTS,
    NAMESPACED_MODE_CLUSTER_GRANTS,
    NAMESPACED_MODE_CLUSTER_READS,
    UNWATCHED_NAMESPACE_GRANTS,
    NAMESPACED_NEEDS,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TESTENV = REPO_ROOT / "hack" / "testenv"
NAMESPACE = "kvpilot-system"
SERVICE_ACCOUNT = "kvpilot"
WATCHED = ("team-a", "team-b")
CRD = "inferenceengines.serving.kvpilot.io"
ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Resources the operator must not touch, checked alongside the contract so "denied" is tested too.
OUTSIDE_CONTRACT = {
    ("", "secrets"),
    ("", "nodes"),
    ("", "namespaces"),
    ("", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "roles"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("kopf.dev", "clusterkopfpeerings"),
}
CLUSTER_SCOPED = {
    ("", "namespaces"),
    ("", "nodes"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("kopf.dev", "clusterkopfpeerings"),
}


@dataclass
class PrivateCluster:
    kubeconfig: Path
    bin_dir: Path
    env: dict[str, str]

    def run(
        self, tool: str, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(argv, input=stdin, env=self.env, capture_output=True, text=True, timeout=300, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stderr or done.stdout}")
        return done

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, **kwargs)


def cache_bin_dir() -> Path:
    """The binary cache directory, as lib.sh computes it (the cache key lives there only)."""
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && printf %s "$TESTENV_BIN"', "lib.sh", str(TESTENV / "lib.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    bin_dir = cache_bin_dir()
    needed = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")
    missing = [name for name in needed if not (bin_dir / name).exists()]
    if missing:
        pytest.skip(f"control plane not built ({', '.join(missing)} missing): run hack/testenv/build.sh")
    state = tmp_path_factory.mktemp("chart-testenv")
    env = dict(os.environ, KVPILOT_TESTENV_DIR=str(state))
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
        env[var] = str(state / "helm" / sub)
    up = subprocess.run(
        [str(TESTENV / "cluster-up.sh")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    try:
        if up.returncode != 0:
            pytest.fail(f"cluster-up.sh failed:\n{up.stderr[-4000:]}")
        yield PrivateCluster(state / "kubeconfig", bin_dir, env)
    finally:
        subprocess.run([str(TESTENV / "cluster-down.sh")], env=env, capture_output=True, timeout=120, check=False)


def access_review(verb: str, group: str, resource: str, namespace: str | None) -> dict[str, Any]:
    """A SubjectAccessReview asking whether the operator's ServiceAccount may do `verb` on `resource`."""
    resource_name, _, subresource = resource.partition("/")
    attributes: dict[str, str] = {"verb": verb, "group": group, "resource": resource_name}
    if subresource:
        attributes["subresource"] = subresource
    if namespace:
        attributes["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            "resourceAttributes": attributes,
        },
    }


def json_stream(text: str) -> list[dict[str, Any]]:
    """The JSON objects `kubectl create -o json` prints one after another for a List it created."""
    decoder, objects, position = json.JSONDecoder(), [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        obj, position = decoder.raw_decode(text, position)
        objects.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    return objects


def permission_mismatches(cluster: PrivateCluster, expected: dict, namespace: str | None) -> list[str]:
    """Every (verb, resource) whose RBAC answer differs from `expected` in `namespace` (None: cluster-wide).

    All questions go to the API server in one `kubectl create` of a List of SubjectAccessReviews.
    """
    universe = set(NAMESPACED_NEEDS) | set(NAMESPACED_MODE_CLUSTER_READS) | OUTSIDE_CONTRACT
    questions = [
        (verb, group, resource)
        for group, resource in sorted(universe)
        if not (namespace and (group, resource) in CLUSTER_SCOPED)
        for verb in ALL_VERBS
    ]
    reviews = {"apiVersion": "v1", "kind": "List", "items": [access_review(*q, namespace) for q in questions]}
    answers = json_stream(cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(reviews)).stdout)
    assert len(answers) == len(questions)
    mismatches = []
    for (verb, group, resource), answer in zip(questions, answers, strict=True):
        want = verb in expected.get((group, resource), frozenset())
        if bool(answer["status"].get("allowed")) != want:
            where = namespace or "cluster-wide"
            mismatches.append(
                f"{verb} {group or 'core'}/{resource} in {where}: expected {'allowed' if want else 'denied'}"
            )
    return mismatches


def wait_for(predicate, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}")


def test_1_installs_into_a_namespace_enforcing_restricted(cluster: PrivateCluster) -> None:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    # Control: the namespace really rejects a pod that breaks "restricted".
    bad = cluster.kubectl(
        "-n", NAMESPACE, "run", "privileged", "--image=busybox", "--privileged", "--dry-run=server", check=False
    )
    assert bad.returncode != 0 and "PodSecurity" in bad.stderr, bad.stderr
    cluster.helm("install", "kvpilot", str(CHART_DIR), "-n", NAMESPACE, "--set", "grafanaDashboard.enabled=true")

    def operator_pod_created() -> bool:
        out = cluster.kubectl(
            "-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "name"
        ).stdout
        return bool(out.strip())

    wait_for(operator_pod_created, "the ReplicaSet to create the operator pod (admitted under restricted)")
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_1_every_values_variant_is_admitted_under_restricted(cluster: PrivateCluster) -> None:
    """Pod Security admission itself judges the pods of every values variant, not only the one installed: each
    rendered pod template goes to the API server as a Pod (server-side dry run) in the namespace that enforces
    "restricted" (the control above proves it rejects a pod that breaks it)."""
    pods: list[tuple[str, dict[str, Any]]] = []
    for variant, files in sorted(VARIANTS.items()):
        values = [arg for name in files for arg in ("--values", str(CHART_DIR / "ci" / name))]
        rendered = cluster.helm("template", "kvpilot", str(CHART_DIR), "-n", NAMESPACE, *values).stdout
        for where, spec in pod_specs(doc for doc in yaml.safe_load_all(rendered) if doc):
            pod = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                   "metadata": {"name": f"restricted-check-{len(pods)}", "namespace": NAMESPACE}}
            pods.append((f"{variant} {where}", pod))
    assert pods, "the chart must render the operator's pod"
    for where, pod in pods:
        done = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
        assert done.returncode == 0, f"{where} is not admitted under restricted: {done.stderr}"
        assert "PodSecurity" not in done.stderr, done.stderr


def test_2_cluster_wide_rbac_is_exactly_the_contract(cluster: PrivateCluster) -> None:
    assert permission_mismatches(cluster, CLUSTER_WIDE_MODE_GRANTS, None) == []
    assert permission_mismatches(cluster, NAMESPACED_NEEDS, "any-namespace") == []


def test_3_namespaced_rbac_is_exactly_the_contract(cluster: PrivateCluster) -> None:
    for namespace in WATCHED:
        cluster.kubectl("create", "namespace", namespace)
    cluster.helm(
        "upgrade", "kvpilot", str(CHART_DIR), "-n", NAMESPACE, "--set", f"watchNamespaces={{{','.join(WATCHED)}}}"
    )
    for namespace in WATCHED:
        assert permission_mismatches(cluster, NAMESPACED_NEEDS, namespace) == []
    assert permission_mismatches(cluster, UNWATCHED_NAMESPACE_GRANTS, "default") == []
    assert permission_mismatches(cluster, NAMESPACED_MODE_CLUSTER_GRANTS, None) == []


def test_4_helm_upgrade_upgrades_the_crd(cluster: PrivateCluster, tmp_path: Path) -> None:
    chart = tmp_path / "kvpilot"
    shutil.copytree(CHART_DIR, chart)
    crd_file = next((chart / "files" / "crds").glob("*.yaml"))
    crd = yaml.safe_load(crd_file.read_text())
    column = {"name": "UpgradeProbe", "type": "string", "jsonPath": ".status.upgradeProbe"}
    for version in crd["spec"]["versions"]:
        version["additionalPrinterColumns"] = [*version.get("additionalPrinterColumns", []), column]
    crd_file.write_text(yaml.safe_dump(crd))
    cluster.helm("upgrade", "kvpilot", str(chart), "-n", NAMESPACE, "--reuse-values")
    live = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert all(column in v.get("additionalPrinterColumns", []) for v in live["spec"]["versions"])


def example_engine(namespace: str) -> dict[str, Any]:
    """An InferenceEngine the CRD accepts: the first one in examples/ (valid against the real schema),
    or a bare one while examples/ is empty (the placeholder CRD accepts any spec)."""
    for path in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceEngine":
                doc["metadata"] = {"name": "kept", "namespace": namespace}
                return doc
    return {
        "apiVersion": "serving.kvpilot.io/v1alpha1",
        "kind": "InferenceEngine",
        "metadata": {"name": "kept", "namespace": namespace},
        "spec": {},
    }


def test_5_uninstall_keeps_the_crd_and_the_engines(cluster: PrivateCluster) -> None:
    engine = example_engine(WATCHED[0])
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(engine))
    out = cluster.helm("uninstall", "kvpilot", "-n", NAMESPACE).stdout
    assert CRD in out, "helm must report the CRD as kept by its resource policy"
    cluster.kubectl("get", "crd", CRD)
    cluster.kubectl("-n", WATCHED[0], "get", "inferenceengine", "kept")
    leftovers = cluster.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=kvpilot", "-o", "name"
    )
    assert leftovers.stdout.strip() == ""
