"""Issue 22's tenancy trials, made permanent: on the local cluster, the operator under the chart's ServiceAccount, and
a tenant who holds only ``kvpilot-edit`` in the team namespace.

- The name takeover: an administrator's Service, Deployment and ConfigMap under the names an engine would render
  stay byte for byte what they were, through the engine's creation and its deletion; the engine says NameConflict,
  naming them, in status and in an Event.
- The foreign pod: a pod wearing an engine's labels, serving believable numbers, is never read, steers no decision,
  and is named in status.
- The permanent apply failure: a Deployment update an admission policy refuses for good, while the engine's pod is
  sampled every second, is retried a handful of times (counted: applies and status writes), and status says so.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Operator, apply, kubectl, wait_for
from tests.e2e.faults import (Team, events, jobs, operator_counter, operator_log_lines, sim_engine, snapshot, trickle,
                              writes_to)


@pytest.fixture(scope="module")
def team(operator: Operator) -> Iterator[Team]:
    t = Team()
    t.create()
    yield t
    t.delete()


def admin_objects(ns: str, name: str) -> list[dict[str, Any]]:
    """An administrator's workload that happens to use the names an engine ``name`` would render."""
    labels = {"app": name}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {"selector": labels, "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"containers": [{"name": "app", "image": "registry.example/payments:1"}]}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-llm-api", "namespace": ns,
                                                               "labels": labels}, "data": {"ledger": "primary"}},
    ]


def test_a_tenant_cannot_take_over_or_delete_objects_the_operator_did_not_create(team: Team) -> None:
    ns, name = team.namespace, "payments"
    for obj in admin_objects(ns, name):
        apply(obj)
    wait_for(lambda: json.loads(snapshot("deployment", name, ns)).get("status", {}).get("observedGeneration") == 1,
             90, "the admin's Deployment to settle")  # the controllers' watches may still be reconnecting
    kinds = {"service": name, "deployment": name, "configmap": f"{name}-llm-api"}
    before = {kind: snapshot(kind, held, ns) for kind, held in kinds.items()}

    team.submit(sim_engine(name, ns))

    def conflict_named_all() -> dict[str, Any] | None:
        c = team.condition(name, "Degraded")
        message = c.get("message", "")
        named = all(w in message for w in ("Service", "Deployment payments", "payments-llm-api"))
        return c if c.get("reason") == "NameConflict" and named else None

    # The Service and the ConfigMap conflict on the first pass; the Deployment is rendered only once the build is
    # done, and a name conflict holds the engine in the permanent back-off (retries 30 and 150 s after the first
    # failure, loop.PERMANENT_BACKOFF_SECONDS). A build that outlasts the first retry (a loaded CI machine, right
    # after the API-server outage trials) is named at the second: wait past it.
    try:
        degraded = wait_for(conflict_named_all, 200, "Degraded/NameConflict naming the three objects")
    except AssertionError as exc:
        status = team.engine(name).get("status") or {}
        raise AssertionError(f"{exc}; conditions {status.get('conditions')}; build {status.get('build')}; "
                             f"jobs {jobs(ns)}") from None
    assert "neither changes nor adopts" in degraded["message"]
    assert team.condition(name, "Progressing")["reason"] == "NameConflict"
    assert events(ns, name, "NameConflict"), "no NameConflict Event"
    for kind, held in kinds.items():
        assert snapshot(kind, held, ns) == before[kind], f"the admin's {kind} changed while the engine ran"

    team.remove(name)
    wait_for(lambda: not team.engine(name), 60, "the engine to be deleted")
    wait_for(lambda: not json.loads(kubectl("get", "jobs", "-n", ns, "-o", "json"))["items"], 60,
             "the garbage collector to delete the engine's build Job")
    for kind, held in kinds.items():
        assert snapshot(kind, held, ns) == before[kind], f"the admin's {kind} changed after the engine's deletion"


# A pod that answers like trtllm-serve under heavy load (queue 400, batch full), and counts the reads of /metrics.
FAKE_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
reads = 0
STAT = {"numActiveRequests": 512, "numQueuedRequests": 400, "maxBatchSizeStatic": 512, "maxBatchSizeRuntime": 512,
        "iterLatencyMS": 30.0, "numCompletedRequests": 4,
        "kvCacheStats": {"usedNumBlocks": 990, "maxNumBlocks": 1000, "tokensPerBlock": 32},
        "inflightBatchingStats": {"numPausedRequests": 0, "numContextRequests": 8, "numGenRequests": 504}}
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        global reads
        if self.path == "/metrics":
            reads += 1
            body = json.dumps([dict(STAT, iter=reads * 10 + i) for i in range(10)])
        elif self.path == "/reads":
            body = json.dumps({"reads": reads})
        else:
            body = "{}"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
"""


def foreign_pod(ns: str, engine: str, name: str) -> dict[str, Any]:
    """What an administrator (or anyone who may create pods there) can run: the engine's labels, its port."""
    labels = {"serving.kvpilot.io/engine": engine, "app.kubernetes.io/component": "server",
              "app.kubernetes.io/managed-by": "kvpilot", "serving.kvpilot.io/backend": "simulated",
              "app.kubernetes.io/name": "inference-engine", "app.kubernetes.io/instance": engine}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                     "containers": [{"name": "server", "image": "registry.example/not-trtllm:1",
                                     "command": ["python3", "-c", FAKE_SERVER, "0.0.0.0", "8000"],
                                     "ports": [{"name": "http", "containerPort": 8000}]}]}}


def fake_reads(ip: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/reads", timeout=3) as resp:
            return int(json.load(resp)["reads"])
    except OSError:
        return None


def test_a_pod_with_the_engines_labels_steers_nothing_and_is_named(team: Team) -> None:
    ns, name = team.namespace, "e3"
    team.submit(sim_engine(name, ns, autotune={"enabled": True, "mode": "Auto", "intervalSeconds": 6,
                                               "warmupSeconds": 0, "cooldownSeconds": 0}))
    kubectl("wait", "--for=condition=Available", f"ie/{name}", "-n", ns, "--timeout=180s")
    with trickle(ns, name):
        _foreign_pod_trial(team, name)
    kubectl("delete", "pod", "e3-evil", "-n", ns, "--wait=false")
    team.remove(name)
    wait_for(lambda: not team.engine(name), 60, "the engine to be deleted")


def _foreign_pod_trial(team: Team, name: str) -> None:
    ns = team.namespace
    wait_for(lambda: team.condition(name, "MetricsValid").get("reason") == "Accepted", 90,
             "the engine's own pod to be sampled")
    batch = team.engine(name)["status"]["batching"]["maxBatchSize"]
    apply(foreign_pod(ns, name, "e3-evil"))
    ip = wait_for(lambda: (json.loads(snapshot("pod", "e3-evil", ns)).get("status") or {}).get("podIP"), 60,
                  "the foreign pod's IP")
    wait_for(lambda: fake_reads(ip) is not None, 60, "the foreign pod to serve")

    def named() -> dict[str, Any] | None:
        c = team.condition(name, "Degraded")
        return c if c.get("reason") == "ForeignPods" and "e3-evil" in c.get("message", "") else None

    wait_for(named, 60, "Degraded/ForeignPods naming e3-evil")
    time.sleep(20)  # 20 sampling periods (intervalSeconds 6: one sample a second) and three tuning intervals
    assert fake_reads(ip) == 0, "the operator read the foreign pod's metrics"
    status = team.engine(name)["status"]
    assert status["batching"]["maxBatchSize"] <= batch  # no Raise: nothing saw the fake queue of 400
    assert (status.get("kvCache") or {}).get("waitingRequests", 0) < 400
    assert "from 1 pods" in team.condition(name, "MetricsValid")["message"]
    assert named() is not None


# An administrator's policy the operator cannot satisfy: serving Deployments in this namespace keep their replicas.
def freeze_replicas(ns: str) -> list[dict[str, Any]]:
    policy = f"freeze-replicas-{ns}"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                          "operations": ["UPDATE"], "resources": ["deployments"]}]},
                  "validations": [{"expression": "object.spec.replicas == oldObject.spec.replicas",
                                   "message": "replicas are frozen in this namespace"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy},
         "spec": {"policyName": policy, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}},
    ]


# The permanent back-off (loop.PERMANENT_BACKOFF_SECONDS: 30, 120, 300, 600 s) retries at 0, 30 and 150 s after the
# first failure and next at 450 s: a 5-minute window from the first failure holds exactly the passes a 160 s one
# does. So 160 s counts all of them, and the bound of the issue (<= 10 in 5 minutes) is checked on that count.
WINDOW_SECONDS = 160


def test_a_write_refused_for_good_backs_off_and_says_so(team: Team, operator: Operator) -> None:
    ns, name = team.namespace, "frozen"
    team.submit(sim_engine(name, ns, autotune={"enabled": True, "mode": "Advisory", "intervalSeconds": 6,
                                               "warmupSeconds": 0}))
    kubectl("wait", "--for=condition=Available", f"ie/{name}", "-n", ns, "--timeout=180s")
    with trickle(ns, name):
        _permanent_failure_trial(team, operator, name)
    team.remove(name)


def _permanent_failure_trial(team: Team, operator: Operator, name: str) -> None:
    ns = team.namespace
    wait_for(lambda: team.condition(name, "MetricsValid").get("reason") == "Accepted", 90, "the pod to be sampled")
    policy = freeze_replicas(ns)
    for doc in policy:
        apply(doc)
    time.sleep(3)  # the API server loads a new policy within a second or two
    applies_before = operator_counter(operator, "kvpilot_api_requests_total", verb="apply", resource="Deployment")
    failed_words = f"Reconcile of InferenceEngine {ns}/{name} failed"
    failed_before = operator_log_lines(operator, failed_words)
    try:
        with writes_to(ns, name) as writes:
            team.patch(name, {"spec": {"serving": {"replicas": 2}}})
            started = time.monotonic()
            degraded = wait_for(lambda: (c := team.condition(name, "Degraded")).get("reason") == "ApplyFailed" and c,
                                60, "Degraded/ApplyFailed")
            time.sleep(max(0.0, WINDOW_SECONDS - (time.monotonic() - started)))
            status_writes = len(writes)
        applies = operator_counter(operator, "kvpilot_api_requests_total", verb="apply",
                                   resource="Deployment") - applies_before
        failed_passes = operator_log_lines(operator, failed_words) - failed_before
        print(f"permanent failure, {WINDOW_SECONDS} s: {applies:.0f} Deployment applies, {failed_passes} failed "
              f"passes, {status_writes} writes of the InferenceEngine (status, and the tenant's one patch)")
        assert "replicas are frozen" in degraded["message"] and "back-off" in degraded["message"]
        assert team.condition(name, "Progressing")["reason"] == "ApplyFailed"  # never "Settled"
        assert 1 <= applies <= 10 and 1 <= failed_passes <= 10
        assert status_writes <= 10 + 1  # + the tenant's own patch of the spec
    finally:
        for doc in reversed(policy):
            kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--wait=false", check=False)
    team.patch(name, {"spec": {"serving": {"replicas": 1}}})  # a spec change retries at once, and succeeds
    # 90 s: a refused apply still in flight when the spec changed is reported by the next pass (k8s/writes.py, late
    # failures), which then holds for the back-off's first 30 s before the retry that succeeds.
    wait_for(lambda: team.condition(name, "Degraded").get("reason") != "ApplyFailed", 90, "the engine to recover")
