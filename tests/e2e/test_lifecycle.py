"""An engine's life on a real API server: build Job -> engine -> Deployment -> pods on fake GPU nodes ->
Available; serving-only and build-affecting changes; scale; deletion. TensorRT-backend pods are faked by
kwok (Jobs complete, serving pods turn Ready), which exercises the operator without a GPU."""

from __future__ import annotations

import json
from typing import Any

from hack.testenv import cluster
from tests.cases.engines import base, override
from tests.e2e.conftest import apply, condition, get, kubectl, wait_for

GPU_LABEL = "nvidia.com/gpu.product"


def engine(ns: str, name: str = "llama", **spec: Any) -> dict[str, Any]:
    doc = override(base(name, backend="tensorrt"), **{"autotune": {"enabled": False}, **spec})
    doc["metadata"]["namespace"] = ns
    return doc


def ie(ns: str, name: str = "llama") -> dict[str, Any]:
    return get("inferenceengine", name, ns) or {}


def jobs(ns: str) -> list[dict[str, Any]]:
    return json.loads(kubectl("get", "jobs", "-n", ns, "-o", "json"))["items"]  # type: ignore[no-any-return]


def pods(ns: str, selector: str = "app.kubernetes.io/component=server") -> list[dict[str, Any]]:
    return json.loads(kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))["items"]  # type: ignore


def available(ns: str, name: str = "llama") -> bool:
    return condition(ie(ns, name), "Available").get("status") == "True"


def test_engine_builds_rolls_out_and_becomes_available(ns: str) -> None:
    apply(engine(ns))
    job = wait_for(lambda: jobs(ns), 60, "the build Job")[0]
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "trtllm-build --checkpoint_dir" in script and "--kv_cache_type paged" in script
    assert job["spec"]["template"]["spec"]["nodeSelector"][GPU_LABEL] == "NVIDIA-H100-80GB-HBM3"
    kubectl("wait", "--for=condition=Available", "ie/llama", "-n", ns, "--timeout=90s")
    status = ie(ns)["status"]
    assert condition(ie(ns), "EngineReady")["reason"] == "EngineBuilt"
    assert status["engine"]["fingerprint"] == status["build"]["fingerprint"]
    assert status["batching"]["summary"] == "64/512"
    (pod,) = pods(ns)
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("gpu-h100")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    index = json.loads(kubectl("get", "configmaps", "-n", ns, "-l", "app.kubernetes.io/component=engine-index",
                               "-o", "json"))["items"]  # one ConfigMap per published fingerprint
    assert [cm["data"]["fingerprint"] for cm in index] == [status["engine"]["fingerprint"]]
    claim = get("pvc", "engines", ns)
    assert claim and index[0]["data"]["claimUID"] == claim["metadata"]["uid"]
    row = kubectl("get", "ie", "llama", "-n", ns, "--no-headers").split()
    assert row[1:4] == ["True", "tensorrt", "64/512"]
    events = kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.kind=InferenceEngine")
    assert "EngineBuildStarted" in events and "EngineBuilt" in events


def test_serving_change_rolls_pods_without_a_build(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 90, "Available")
    fp = ie(ns)["status"]["engine"]["fingerprint"]
    apply(engine(ns, batching__maxBatchSize=128, serving__replicas=2))
    wait_for(lambda: ie(ns)["status"].get("readyReplicas") == 2 and
             ie(ns)["status"]["batching"]["maxBatchSize"] == 128, 90, "two pods at 128")
    assert len(jobs(ns)) == 1 and ie(ns)["status"]["engine"]["fingerprint"] == fp
    for pod in wait_for(lambda: [p for p in pods(ns) if "128" in p["spec"]["containers"][0]["args"]] or None, 60,
                        "pods with the new batch size"):
        assert pod["metadata"]["annotations"]["serving.kvpilot.io/fingerprint"] == fp


def test_build_change_keeps_the_old_engine_until_the_new_one_is_ready(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 90, "Available")
    old_fp = ie(ns)["status"]["engine"]["fingerprint"]
    kubectl("patch", "ie", "llama", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"build": {"maxBatchSize": 1024, "kvCache": {"tokensPerBlock": 64}}}}))
    new_job = wait_for(lambda: [j for j in jobs(ns) if j["metadata"]["annotations"]["serving.kvpilot.io/fingerprint"]
                                != old_fp], 60, "a second build Job")[0]
    new_fp = new_job["metadata"]["annotations"]["serving.kvpilot.io/fingerprint"]
    # While it builds (kwok completes it quickly), every ready pod serves either engine, never nothing.
    def settled() -> bool:
        ready = [p for p in pods(ns) if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in p["status"].get("conditions", []))]
        fps = {p["metadata"]["annotations"]["serving.kvpilot.io/fingerprint"] for p in ready}
        assert fps <= {old_fp, new_fp}
        return ie(ns)["status"]["engine"]["fingerprint"] == new_fp and fps == {new_fp}
    wait_for(settled, 90, "the new engine serving")
    assert ie(ns)["status"]["batching"]["summary"] == "64/1024"


def test_a_2048_start_with_no_tuner_bound_is_kept_and_an_explicit_1024_clamps_it(ns: str) -> None:
    """TensorRT-LLM's default start, 2048, with autotune.maxBatchSize left out: the API server stores no bound,
    the operator derives 2048 (the larger of 1024 and the start), and the tuner, deciding every pass (here on
    pods with no metrics: it holds), keeps the start. The control: a bound of 1024 written in the spec clamps it
    at once, so the first half is the tuner choosing, not a tuner that never ran."""
    tuning = {"enabled": True, "mode": "Auto", "intervalSeconds": 5, "warmupSeconds": 0}
    apply(engine(ns, build__maxBatchSize=2048, batching__maxBatchSize=2048, autotune=tuning))

    def decided_after_the_rollout() -> dict[str, Any] | None:
        doc = ie(ns)
        last = ((doc.get("status") or {}).get("autotune") or {}).get("recommendation") or {}
        return doc if available(ns) and last.get("reason") not in (None, "RolloutInProgress") else None
    status = wait_for(decided_after_the_rollout, 90, "Available with a tuner decision after the rollout")["status"]
    assert "maxBatchSize" not in ie(ns)["spec"]["autotune"]
    assert status["batching"]["maxBatchSize"] == 2048 and status["batching"]["summary"] == "2048/2048", status
    assert status["autotune"]["recommendation"]["reason"] != "OutOfBounds", status["autotune"]
    kubectl("patch", "ie", "llama", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"autotune": {"maxBatchSize": 1024}}}))
    clamped = wait_for(lambda: ie(ns)["status"]["batching"]["maxBatchSize"] == 1024 and ie(ns)["status"], 60,
                       "the start clamped into the written bound")
    assert any(h["reason"] == "OutOfBounds" and h["toBatchSize"] == 1024 for h in clamped["autotune"]["history"])


def test_scale_subresource(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 90, "Available")
    kubectl("scale", "ie/llama", "-n", ns, "--replicas=3")
    wait_for(lambda: ie(ns)["status"].get("readyReplicas") == 3, 90, "3 ready replicas")
    scale = json.loads(kubectl("get", "--raw",
                               f"/apis/serving.kvpilot.io/v1alpha1/namespaces/{ns}/inferenceengines/llama/scale"))
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert "serving.kvpilot.io/engine=llama" in scale["status"]["selector"]


def test_too_many_gpus_leave_pods_pending_with_a_reason(ns: str) -> None:
    # One pod asking for 16 GPUs (gpusPerNode 16 keeps it on one node): no node of the cluster has that many.
    apply(engine(ns, build__tensorParallelSize=16, serving__gpusPerNode=16))
    def says_why() -> dict[str, Any] | None:
        degraded = condition(ie(ns), "Degraded")
        return degraded if degraded.get("reason") == "InsufficientGPU" else None
    degraded = wait_for(says_why, 120, "Degraded=InsufficientGPU")
    assert "nvidia.com/gpu" in degraded["message"]
    assert condition(ie(ns), "Available")["status"] == "False"


def test_two_engines_with_the_same_build_inputs_share_one_build(ns: str) -> None:
    apply(engine(ns, name="a"))
    apply(engine(ns, name="b", batching__maxBatchSize=32))
    wait_for(lambda: available(ns, "a") and available(ns, "b"), 120, "both Available")
    (job,) = jobs(ns)
    owners = {o["name"] for o in job["metadata"]["ownerReferences"]}
    assert owners == {"a", "b"}


def test_deleting_the_engine_removes_every_child(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 90, "Available")
    kubectl("delete", "ie", "llama", "-n", ns, "--timeout=60s")
    def gone() -> bool:
        left = kubectl("get", "deployments,services,configmaps,jobs,pods", "-n", ns, "-l",
                       "app.kubernetes.io/managed-by=kvpilot,app.kubernetes.io/component!=engine-index", "-o", "name")
        return left.strip() == ""
    wait_for(gone, 90, "every child deleted")
    assert get("inferenceengine", "llama", ns) is None


def shared_claim(ns: str, name: str) -> None:
    """A hostPath PersistentVolume pre-bound to the claim ``name`` the operator will create (no provisioner here)."""
    path = cluster.testenv_dir() / "volumes" / ns / name
    path.mkdir(parents=True, exist_ok=True)
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-{name}"},
          "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                   "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(path)},
                   "claimRef": {"namespace": ns, "name": name}}}
    kubectl("apply", "-f", "-", stdin=json.dumps(pv))


def drop_shared_claim(ns: str, name: str) -> None:
    kubectl("delete", "pv", f"{ns}-{name}", "--wait=false", check=False)


def test_a_claim_the_operator_applies_outlives_the_engine_that_asked_for_it(ns: str) -> None:
    """Issue 13: with one owner, deleting that engine had the garbage collector delete the cache every other
    engine on the claim serves from. The claim is one the operator creates (issue 22: it never writes a claim of
    that name it did not create, such as the namespace's pre-made ``engines``), on a volume pre-bound to it."""
    shared_claim(ns, "shared")
    try:
        apply(engine(ns, name="a", engineCache={"claimName": "shared", "size": "100Gi", "accessMode": "ReadWriteMany"}))
        apply(engine(ns, name="b", engineCache={"claimName": "shared"}))
        wait_for(lambda: available(ns, "a") and available(ns, "b"), 120, "both Available")
        claim = get("persistentvolumeclaim", "shared", ns) or {}
        assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvpilot"
        assert "ownerReferences" not in claim["metadata"], claim["metadata"].get("ownerReferences")
        assert claim["metadata"]["annotations"]["serving.kvpilot.io/retention"]
        kubectl("delete", "ie", "a", "-n", ns, "--timeout=60s")
        wait_for(lambda: get("deployment", "a", ns) is None, 90, "a's Deployment deleted by the garbage collector")
        claim = get("persistentvolumeclaim", "shared", ns) or {}
        assert claim and "deletionTimestamp" not in claim["metadata"]
        assert available(ns, "b")
    finally:
        drop_shared_claim(ns, "shared")
