"""GitOps as the pipelines do it: the manifest is server-side applied under Argo CD's field manager (as Argo CD
with ServerSideApply=true, or Flux's kustomize-controller, do), the tuner then raises the batch limit and rolls
the pods, and the pipeline's next syncs must find nothing to change: ``kubectl diff --server-side`` is empty,
re-applying undoes nothing and restarts nothing, and field ownership shows the operator owning only the
InferenceEngine's status and its children. A change in Git (replicas) then scales without touching the
tuner's choice. The Argo CD health check (deploy/argocd) is evaluated by a real Lua interpreter on the
status objects of this run: Progressing, Healthy, Degraded; they are saved for tests/unit/test_argocd_health.py
when KVPILOT_CAPTURE_ARGOCD is set."""

from __future__ import annotations

import asyncio
import json
import functools
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import ROOT, condition, get, kubectl, run_kubectl, wait_for

from hack import argocd_health, closedloop


MANAGER = "argocd-controller"
TESTDATA = ROOT / "deploy" / "argocd" / "testdata"


def sync(doc: dict[str, Any]) -> str:
    """What the pipeline does on every sync: server-side apply under its own field manager."""
    return kubectl("apply", "--server-side", f"--field-manager={MANAGER}", "-f", "-", stdin=yaml.safe_dump(doc))


@functools.cache
def _differ() -> Path:
    """An executable that runs diff_without_status.py with this interpreter: kubectl passes KUBECTL_EXTERNAL_DIFF
    only its flags, so a script path after the interpreter would be dropped."""
    wrapper = Path(tempfile.mkdtemp(prefix="kvpilot-differ-")) / "diff-without-status"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                       f"{shlex.quote(str(Path(__file__).with_name('diff_without_status.py')))} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def diff(doc: dict[str, Any]) -> tuple[int, str]:
    """``kubectl diff --server-side``: exit 0 and no output when the live object already is the manifest. Status
    aside, as Argo CD compares a custom resource (tests/e2e/diff_without_status.py): an operator's status write
    between kubectl's read of the live object and its dry run is no difference a sync could make or undo."""
    done = run_kubectl("diff", "--server-side", f"--field-manager={MANAGER}", "-f", "-", stdin=yaml.safe_dump(doc),
                       env={"KUBECTL_EXTERNAL_DIFF": str(_differ())})
    return done.returncode, done.stdout + done.stderr


def pods(ns: str, name: str) -> dict[str, str]:
    """{uid: name} of the engine's live serving pods."""
    selector = f"serving.kvpilot.io/engine={name},app.kubernetes.io/component=server"
    out = json.loads(kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))
    return {p["metadata"]["uid"]: p["metadata"]["name"] for p in out["items"] if not p["metadata"].get("deletionTimestamp")}


def managed_fields(kind: str, name: str, ns: str) -> list[dict[str, Any]]:
    out = kubectl("get", kind, name, "-n", ns, "--show-managed-fields", "-o", "json")
    return list(json.loads(out)["metadata"]["managedFields"])


def settled(ns: str, name: str) -> dict[str, Any] | None:
    ie = get("inferenceengine", name, ns)
    ok = (condition(ie, "Available").get("status") == "True" and condition(ie, "Progressing").get("status") == "False"
          and (ie or {}).get("status", {}).get("observedGeneration") == (ie or {}).get("metadata", {}).get("generation"))
    return ie if ok else None


def capture(states: dict[str, dict[str, Any]], health: str, ie: dict[str, Any]) -> None:
    """Keep the first object seen in each health state (trimmed of what varies per run but not its status)."""
    if health in states:
        return
    meta = ie["metadata"]
    states[health] = {"apiVersion": ie["apiVersion"], "kind": ie["kind"],
                      "metadata": {"name": meta["name"], "namespace": "default", "generation": meta["generation"]},
                      "spec": ie["spec"], "status": ie["status"]}


def test_a_gitops_sync_never_fights_the_tuner(ns: str) -> None:
    manifest = closedloop.closed_loop_engine(ns, "gitops", start_batch=4, replicas=1)
    manifest["spec"]["autotune"]["cooldownSeconds"] = 600  # one tuner change, so Git's changes stand apart
    states: dict[str, dict[str, Any]] = {}
    sync(manifest)

    def health_now() -> str:
        ie = get("inferenceengine", "gitops", ns) or {}
        status, _ = argocd_health.health(ie)
        if ie.get("status"):
            capture(states, status, ie)
        return status

    wait_for(lambda: health_now() == "Progressing" and "Progressing" in states, 60, "a Progressing status")
    ie = wait_for(lambda: settled(ns, "gitops"), 180, "the engine serving")
    assert argocd_health.health(ie)[0] == "Healthy"
    capture(states, "Healthy", ie)
    assert diff(manifest) == (0, ""), "a fresh sync must find nothing to change"

    # The tuner acts: a load past the batch limit, a raise, a rolling restart. Meanwhile Argo CD's view of the
    # engine is sampled as its health assessment would see it.
    stats = closedloop.LoadStats()
    seen: list[tuple[int, str, str]] = []  # (runtime limit, health, message)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            e = get("inferenceengine", "gitops", ns) or {}
            seen.append((e.get("status", {}).get("batching", {}).get("maxBatchSize", 0), *argocd_health.health(e)))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        asyncio.run(closedloop.generate_load(lambda: closedloop.ready_endpoints(ns, "gitops"), rate=12, seconds=60,
                                             prompt_words=200, max_tokens=200, stats=stats))
        raised = wait_for(lambda: (e := get("inferenceengine", "gitops", ns)) and
                          e["status"]["batching"]["maxBatchSize"] > 4 and e, 60, "the tuner raising the limit")
        tuned = raised["status"]["batching"]["maxBatchSize"]
        ie = wait_for(lambda: (e := settled(ns, "gitops")) and e["status"]["batching"]["maxBatchSize"] == tuned and e,
                      180, "the rollout of the tuned limit")
    finally:
        watching.set()
        watcher.join(10)
    # The tuner's rollout shows as Progressing (RollingOut), then Healthy again; spec never changed.
    assert any(b == tuned and h == "Progressing" and m.startswith("RollingOut") for b, h, m in seen), seen[-20:]
    assert argocd_health.health(ie)[0] == "Healthy"
    dep = get("deployment", "gitops", ns)
    assert dep is not None
    before = {"pods": pods(ns, "gitops"), "deployment": dep["metadata"]["generation"],
              "engine": ie["metadata"]["generation"], "rv": ie["metadata"]["resourceVersion"]}

    # The pipeline syncs again: nothing to change, nothing undone, nothing restarted.
    assert diff(manifest) == (0, ""), "after the tuner acted, the manifest must still match the live object"
    out = sync(manifest)
    assert "serverside-applied" in out
    time.sleep(8)  # more than two resync periods of the operator (3s here): time to undo anything, if it would
    ie = get("inferenceengine", "gitops", ns)
    dep = get("deployment", "gitops", ns)
    assert ie is not None and dep is not None
    assert ie["status"]["batching"]["maxBatchSize"] == tuned, "a sync undid the tuner's choice"
    assert ie["metadata"]["generation"] == before["engine"] and dep["metadata"]["generation"] == before["deployment"]
    assert pods(ns, "gitops") == before["pods"], "a sync restarted pods"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max_batch_size") + 1] == str(tuned)

    # Field ownership: Git owns the spec, the operator only status (and its children, which Git never touches).
    owners = managed_fields("inferenceengine", "gitops", ns)
    assert any(m["manager"] == MANAGER and m["operation"] == "Apply" and "f:spec" in m["fieldsV1"] for m in owners)
    for m in owners:
        if m["manager"] != MANAGER:
            assert m.get("subresource") == "status" and set(m["fieldsV1"]) <= {"f:status"}, (
                f"{m['manager']} owns more than status: {m['fieldsV1']}")
            assert m["operation"] == "Update"
    assert any(m["manager"] != MANAGER for m in owners), "the operator's status writes must show up"
    for kind in ("deployment", "service"):
        child = get(kind, "gitops", ns)
        assert child is not None
        managers = {m["manager"] for m in managed_fields(kind, "gitops", ns)}
        assert MANAGER not in managers and "kvpilot" in managers, f"{kind}: {managers}"
        assert [r["kind"] for r in child["metadata"]["ownerReferences"]] == ["InferenceEngine"]

    # A change in Git (scale out) is applied without resetting the tuner or restarting the serving pod.
    scaled = {**manifest, "spec": {**manifest["spec"], "serving": {**manifest["spec"]["serving"], "replicas": 2}}}
    code, text = diff(scaled)
    assert code == 1 and "replicas: 2" in text
    sync(scaled)
    ie = wait_for(lambda: (e := settled(ns, "gitops")) and e["status"]["observedGeneration"] == before["engine"] + 1
                  and len(pods(ns, "gitops")) == 2 and e, 120, "two serving pods")
    newest = ie["status"]["autotune"]["history"][0]
    if ie["status"]["batching"]["maxBatchSize"] == tuned:
        assert set(before["pods"]) <= set(pods(ns, "gitops")), "scaling out restarted the serving pod"
    else:  # the tuner may act again (an escalating raise skips the cooldown): then it, not Git, rolled the pods
        assert newest["applied"] is True and newest["toBatchSize"] == ie["status"]["batching"]["maxBatchSize"]
        assert newest["fromBatchSize"] == tuned, newest
    assert ie["status"]["batching"]["maxBatchSize"] != manifest["spec"]["batching"]["maxBatchSize"]
    assert diff(scaled) == (0, "")

    # Degraded: an engine whose cache claim does not exist (a person must create it).
    broken = closedloop.closed_loop_engine(ns, "no-claim", start_batch=4, replicas=1)
    broken["spec"]["engineCache"] = {"claimName": "missing"}
    sync(broken)
    ie = wait_for(lambda: (e := get("inferenceengine", "no-claim", ns)) and
                  condition(e, "Degraded").get("status") == "True" and e, 60, "a Degraded engine")
    status, message = argocd_health.health(ie)
    assert status == "Degraded" and "CacheClaimMissing" in message
    capture(states, "Degraded", ie)
    assert set(states) == {"Progressing", "Healthy", "Degraded"}
    if os.environ.get("KVPILOT_CAPTURE_ARGOCD"):
        TESTDATA.mkdir(parents=True, exist_ok=True)
        for health, obj in states.items():
            (TESTDATA / f"{health.lower()}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))
    assert stats.ok > 0
