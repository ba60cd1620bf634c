"""The real LeaderWorkerSet controller on the local cluster (hack/testenv/lwsctl.py): its webhooks default and
validate through the ExternalName route, the controller turns a LeaderWorkerSet into a leader StatefulSet, a
worker StatefulSet per group and pods, and the local kubelet runs both kinds of pod with the LWS environment
and cluster DNS names the leader and workers use to find each other."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

import pytest

from hack.testenv import cluster
from tests.testenv.test_localcluster_e2e import SIM, get, pods, wait_until

pytestmark = pytest.mark.e2e

POOL = {"kvpilot.io/testenv-pool": "multinode"}
TOLERATION = {"key": "kvpilot.io/testenv-pool", "operator": "Equal", "value": "multinode", "effect": "NoSchedule"}


def template(command: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"labels": dict(SIM)}, "spec": {
        "nodeSelector": POOL, "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "main", "image": "kvsim", "command": ["sh", "-c", command],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def lws(name: str, **rollout: int) -> dict[str, Any]:
    # The worker resolves the leader through the cluster DNS (getent), as a multi-node engine's ranks do.
    worker = 'until getent hosts "$LWS_LEADER_ADDRESS"; do sleep 0.2; done; exec sleep 3600'
    obj: dict[str, Any] = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {
            "size": 2, "leaderTemplate": template("exec sleep 3600", 8), "workerTemplate": template(worker, 8)}},
    }
    if rollout:
        obj["spec"]["rolloutStrategy"] = {"type": "RollingUpdate", "rollingUpdateConfiguration": rollout}
    return obj


def kubectl_run(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    argv = [str(cluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig_path()}", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, env=cluster.env())


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def test_validating_webhook_refuses_what_lws_forbids(ns: str) -> None:
    done = kubectl_run("create", "-n", ns, "-f", "-", stdin=json.dumps(lws("bad", maxUnavailable=0, maxSurge=0)))
    assert done.returncode != 0
    assert 'admission webhook "vleaderworkerset.kb.io" denied the request' in done.stderr
    assert "must not be 0 when `maxSurge` is 0" in done.stderr


def test_lws_is_defaulted_reconciled_and_run_as_leader_and_worker_pods(ns: str) -> None:
    cluster.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(lws("mn")))
    stored = get(ns, "leaderworkerset", "mn")
    assert stored["spec"]["networkConfig"]["subdomainPolicy"] == "Shared"  # set by the mutating webhook only
    assert stored["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxSurge": 0, "maxUnavailable": 1, "partition": 0}

    wait_until("the group Ready", lambda: (get(ns, "leaderworkerset", "mn").get("status") or {}).get("readyReplicas"),
               120)
    leader_sts, worker_sts = get(ns, "statefulset", "mn"), get(ns, "statefulset", "mn-0")
    assert leader_sts["spec"]["replicas"] == 1 and worker_sts["spec"]["replicas"] == 1
    (leader,) = pods(ns, "leaderworkerset.sigs.k8s.io/worker-index=0")
    (worker,) = pods(ns, "leaderworkerset.sigs.k8s.io/worker-index=1")
    assert (leader["metadata"]["name"], worker["metadata"]["name"]) == ("mn-0", "mn-0-1")
    # The pod webhook's environment, and hostnames under the LWS's headless Service.
    for pod in (leader, worker):
        env = env_of(pod)
        assert env["LWS_LEADER_ADDRESS"] == f"mn-0.mn.{ns}" and env["LWS_GROUP_SIZE"] == "2"
        assert pod["spec"]["subdomain"] == "mn" and pod["status"]["phase"] == "Running"
        # The local kubelet ran it (its pod range), not kwok.
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(cluster.settings()["POD_CIDR"])
    assert env_of(worker)["LWS_WORKER_INDEX"] == "1"
    # Both run on the multi-node pool, one 8-GPU node each.
    assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} <= {f"gpu-h100-mn-{i}" for i in range(6)}
    hosts = (cluster.testenv_dir() / "run" / "cluster-hosts").read_text()
    assert f"{leader['status']['podIP']} mn-0.mn.{ns}.svc.cluster.local" in hosts
    assert f"{worker['status']['podIP']} mn-0-1.mn.{ns}.svc.cluster.local" in hosts
