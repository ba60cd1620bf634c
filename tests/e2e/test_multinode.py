"""Multi-node engines against the real LeaderWorkerSet controller and webhooks on the local cluster.

The golden renders (tests/golden/multinode/) pass a server-side dry run: the LWS CRD's schema and LWS's own
validating and mutating webhooks accept the rendered LeaderWorkerSet, and the API server the rest."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import closedloop
from hack.testenv import cluster
from tests.e2e.conftest import apply, condition, get, kubectl, run_kubectl, wait_for
from tests.e2e.test_simulated import sim_engine

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "multinode"


@pytest.fixture(scope="module")
def bare_ns(kube: Path) -> Iterator[str]:
    """A namespace without the operator (nothing is stored in it: dry runs only)."""
    name = f"e2e-mn-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_rendered_children_pass_a_server_side_dry_run(bare_ns: str, golden: Path) -> None:
    docs = [d for d in yaml.safe_load_all(golden.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = bare_ns
    done = run_kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                       stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    assert done.returncode == 0, done.stderr
    items, pos, decoder = [], 0, json.JSONDecoder()  # one JSON document per object
    while done.stdout[pos:].strip():
        obj, end = decoder.raw_decode(done.stdout, pos + len(done.stdout[pos:]) - len(done.stdout[pos:].lstrip()))
        items.append(obj)
        pos = end
    (lws,) = [i for i in items if i["kind"] == "LeaderWorkerSet"]
    rendered = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    # The webhooks kept every field we set (they only default what is absent).
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == rendered["spec"]["leaderWorkerTemplate"]["size"]
    assert lws["spec"]["rolloutStrategy"] == rendered["spec"]["rolloutStrategy"]
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "Shared"}
    assert {i["kind"] for i in items} >= {"Secret", "ConfigMap", "LeaderWorkerSet", "Service"}


# ---------------------------------------------------------------- a simulated two-node engine, with the operator
PROFILE = "llama-3.1-405b-bf16-h100-tp8-pp2"  # kvsim's 405B BF16 on 2 x 8 H100s
POOL = {"kvpilot.io/testenv-pool": "multinode"}  # hack/testenv/nodes.yaml: six tainted 8-GPU H100 nodes
POOL_TOLERATION = {"key": "kvpilot.io/testenv-pool", "operator": "Exists", "effect": "NoSchedule"}


def mn_engine(ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """A simulated 16-rank engine on 8-GPU nodes: each replica a group of two pods on the multi-node pool."""
    return sim_engine(ns, "mn", runtime__simulation={"profile": PROFILE, "speedupRatio": 10},
                      build={"tensorParallelSize": 8, "pipelineParallelSize": 2},
                      serving={"gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpusPerNode": 8, "replicas": replicas,
                               "nodeSelector": POOL, "tolerations": [POOL_TOLERATION]}, **spec)


def groups(ns: str) -> dict[str, Any]:
    return ((get("inferenceengine", "mn", ns) or {}).get("status") or {}).get("groups") or {}


def group_pods(ns: str) -> list[dict[str, Any]]:
    out = kubectl("get", "pods", "-n", ns, "-l", "leaderworkerset.sigs.k8s.io/name=mn-lws", "-o", "json")
    return json.loads(out)["items"]  # type: ignore[no-any-return]


def ready_leader_ips(ns: str) -> list[str]:
    """The IPs of the Ready leaders that serve: a terminating pod (a group being recreated) may still say Ready
    while its server has stopped, and a Service leaves it out too (CI once got "connection refused" from one)."""
    return [p["status"]["podIP"] for p in group_pods(ns)
            if p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index") == "0"
            and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]


def complete(ip: str) -> int:
    body = json.dumps({"model": "mn", "prompt": "Hello", "max_tokens": 8}).encode()
    req = urllib.request.Request(f"http://{ip}:8000/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(json.load(resp)["usage"]["completion_tokens"])


def lws_limits(ns: str) -> dict[str, Any] | None:
    lws = get("leaderworkerset", "mn-lws", ns) or {}
    return ((lws.get("spec") or {}).get("rolloutStrategy") or {}).get("rollingUpdateConfiguration")


def serves(ns: str) -> None:
    """Two groups of a 16-rank engine go Available, status shows them, and every rank's engine was built."""
    start = time.monotonic()
    apply(mn_engine(ns, replicas=2))  # 4 of the pool's 6 nodes
    kubectl("wait", "--for=condition=Available", "ie/mn", "-n", ns, "--timeout=240s")
    TIMES["available after apply"] = time.monotonic() - start
    lws = get("leaderworkerset", "mn-lws", ns)
    assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    seen = wait_for(lambda: groups(ns) if groups(ns).get("ready") == 2 else None, 120, "both groups Ready")
    assert (seen["replicas"], seen["podsPerGroup"], seen["readyPods"], seen["summary"]) == (2, 2, 4, "2/2")
    row = kubectl("get", "ie", "mn", "-n", ns, "--no-headers", "-o",
                  "custom-columns=G:.status.groups.summary,P:.status.groups.podsPerGroup,R:.status.readyReplicas")
    assert row.split() == ["2/2", "2", "2"]  # the printer columns' paths; readyReplicas counts groups
    assert all(complete(ip) == 8 for ip in ready_leader_ips(ns))
    fp = get("inferenceengine", "mn", ns)["status"]["engine"]["fingerprint"]  # type: ignore[index]
    engine_dir = cluster.testenv_dir() / "volumes" / ns / "engines" / fp / "engine"
    assert sorted(p.name for p in engine_dir.glob("rank*.engine")) == sorted(f"rank{i}.engine" for i in range(16))


def rolls_with_one_surge_group(ns: str) -> None:
    """The free GPUs place one more group (two nodes free), so Auto rolls with one surge group (maxSurge 1,
    maxUnavailable 0), group by group: capacity never drops, and no request fails under load."""
    wait_for(lambda: lws_limits(ns) == {"maxSurge": 1, "maxUnavailable": 0, "partition": 0}, 60,
             "Auto to surge by one group")
    before = {p["metadata"]["uid"] for p in group_pods(ns)}
    stats = closedloop.LoadStats()
    seen: dict[str, Any] = {"max_groups": 0, "order": []}

    def rolled() -> bool:
        st = (get("leaderworkerset", "mn-lws", ns) or {}).get("status") or {}
        seen["max_groups"] = max(seen["max_groups"], int(st.get("replicas") or 0))
        fresh = sorted(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] for p in group_pods(ns)
                       if p["metadata"]["uid"] not in before
                       and p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index") == "0")
        if fresh != (seen["order"][-1] if seen["order"] else None):
            seen["order"].append(fresh)
        surge_left = any(p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/group-index") == "2"
                         for p in group_pods(ns))
        return (st.get("updatedReplicas") == 2 and st.get("readyReplicas") == 2 and st.get("replicas") == 2
                and fresh == ["0", "1"] and not surge_left and len(ready_leader_ips(ns)) == 2)

    async def drive() -> None:
        with closedloop.service_gateway(ns, "mn") as gateway:
            await closedloop.generate_load(gateway.endpoints, rate=4, seconds=240, prompt_words=50, max_tokens=16,
                                           stats=stats, stop=rolled)

    start = time.monotonic()
    kubectl("patch", "ie", "mn", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"batching": {"maxBatchSize": 48}}}))
    asyncio.run(drive())
    TIMES["rollout of 2 groups"] = time.monotonic() - start
    print(f"multi-node rollout: {stats.sent} requests, {stats.ok} ok, {stats.errors} failed, at most "
          f"{seen['max_groups']} groups, new leaders by group index {seen['order']}")
    assert rolled(), "the rollout did not finish"
    assert stats.errors == 0 and stats.ok == stats.sent > 0, (stats.sent, stats.ok, stats.errors)
    assert seen["max_groups"] == 3  # exactly one surge group
    assert seen["order"][0] == ["2"]  # the surge group first, then the old groups one at a time
    assert all(len(b) - len(a) <= 1 for a, b in zip(seen["order"], seen["order"][1:]))
    lws = get("leaderworkerset", "mn-lws", ns)
    assert lws is not None
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert leader["metadata"]["annotations"]["serving.kvpilot.io/max-batch-size"] == "48"


def recovers_a_group_whose_worker_is_deleted(ns: str) -> None:
    """Deleting a worker recreates its whole group (RecreateGroupOnPodRestart); the other group keeps the engine
    Available meanwhile, and status.groups says what happened."""
    (worker,) = [p for p in group_pods(ns) if p["metadata"]["name"] == "mn-lws-0-1"]
    deleted = time.monotonic()
    kubectl("delete", "pod", "mn-lws-0-1", "-n", ns, "--wait=false")
    recreated = wait_for(lambda: groups(ns).get("lastRecreation"), 90, "status.groups.lastRecreation")
    assert recreated["group"] == 0 and "RecreateGroupOnPodRestart" in recreated["message"]
    assert condition(get("inferenceengine", "mn", ns), "Available")["status"] == "True"  # group 1 serves
    wait_for(lambda: groups(ns).get("ready") == 2 and len(ready_leader_ips(ns)) == 2, 120, "both groups Ready again")
    TIMES["group recovery after a worker deletion"] = time.monotonic() - deleted
    assert all(complete(ip) == 8 for ip in ready_leader_ips(ns))
    assert worker["metadata"]["uid"] not in {p["metadata"]["uid"] for p in group_pods(ns)}


def scales_by_groups_and_says_why_a_group_cannot_be_placed(ns: str) -> None:
    """The scale subresource counts groups; four groups need 8 of the pool's 6 nodes, so pods of the new groups
    stay Pending (the leaders created first usually get the last two nodes, and their workers wait) and Degraded
    says why, naming the pod and the scheduler's reason."""
    kubectl("scale", "ie/mn", "-n", ns, "--replicas=4")
    lws = wait_for(lambda: (get("leaderworkerset", "mn-lws", ns) or {}).get("spec", {}).get("replicas") == 4, 60,
                   "the LWS scaled to 4 groups")
    assert lws
    degraded = wait_for(lambda: (c := condition(get("inferenceengine", "mn", ns), "Degraded")).get("reason")
                        == "InsufficientGPU" and c, 90, "Degraded InsufficientGPU")
    assert re.match(r"Pod mn-lws-[23](-1)? cannot be scheduled: ", degraded["message"]), degraded["message"]
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    print(f"multi-node: scaled to 4 groups: Degraded {degraded['message'][:80]}...")
    assert condition(get("inferenceengine", "mn", ns), "Available")["status"] == "True"  # 2 groups still serve


TIMES: dict[str, float] = {}


def test_a_two_node_engine_serves_rolls_by_groups_and_recovers_a_group(ns: str) -> None:
    """One engine through three phases (one engine start and one namespace for all: CI minutes)."""
    serves(ns)
    rolls_with_one_surge_group(ns)
    recovers_a_group_whose_worker_is_deleted(ns)
    scales_by_groups_and_says_why_a_group_cannot_be_placed(ns)
    print("multi-node e2e: " + ", ".join(f"{what} {s:.1f}s" for what, s in TIMES.items()))
