"""The operator reads its children from a watch cache and writes only on a diff; the cache must not hide a
deletion or an out-of-band edit: a child deleted or edited by hand is restored (issue 12)."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import apply, get, kubectl, wait_for
from tests.e2e.test_lifecycle import available, engine


def test_a_child_deleted_or_edited_by_hand_is_restored(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 120, "Available")
    dep = get("deployment", "llama", ns)
    assert dep is not None and dep["spec"]["replicas"] == 1
    # An edit of a field kvpilot owns (the hash annotation it wrote is left as it was).
    kubectl("scale", "deployment/llama", "-n", ns, "--replicas=3")
    wait_for(lambda: (get("deployment", "llama", ns) or {}).get("spec", {}).get("replicas") == 1, 60,
             "the Deployment's replicas restored to 1")
    patch = json.dumps({"data": {"llm-api.yaml": "tampered: true\n"}})
    before = (get("configmap", "llama-llm-api", ns) or {})["data"]
    kubectl("patch", "configmap", "llama-llm-api", "-n", ns, "--type=merge", "-p", patch)
    wait_for(lambda: (get("configmap", "llama-llm-api", ns) or {}).get("data") == before, 60,
             "the LLM-API ConfigMap restored")
    # Deletions: the Service, the ConfigMap and the Deployment come back.
    uid = (get("service", "llama", ns) or {})["metadata"]["uid"]
    dep_uid = (get("deployment", "llama", ns) or {})["metadata"]["uid"]
    kubectl("delete", "service", "llama", "-n", ns)
    kubectl("delete", "configmap", "llama-llm-api", "-n", ns)
    kubectl("delete", "deployment", "llama", "-n", ns, "--wait=false")
    wait_for(lambda: (get("service", "llama", ns) or {}).get("metadata", {}).get("uid") not in (None, uid), 60,
             "the Service re-created")
    wait_for(lambda: get("configmap", "llama-llm-api", ns), 60, "the LLM-API ConfigMap re-created")
    wait_for(lambda: (get("deployment", "llama", ns) or {}).get("metadata", {}).get("uid") not in (None, dep_uid),
             60, "the Deployment re-created")
    wait_for(lambda: available(ns), 60, "Available again")


def test_an_unchanged_engine_is_not_rewritten(ns: str) -> None:
    apply(engine(ns))
    wait_for(lambda: available(ns), 120, "Available")
    time.sleep(4)  # let the rollout's last status writes land
    versions = {kind: (get(kind, name, ns) or {})["metadata"]["resourceVersion"]
                for kind, name in (("service", "llama"), ("configmap", "llama-llm-api"), ("deployment", "llama"))}
    ie_version = (get("inferenceengine", "llama", ns) or {})["metadata"]["resourceVersion"]
    time.sleep(10)  # the e2e operator resyncs every 3 s: three passes or more
    after = {kind: (get(kind, name, ns) or {})["metadata"]["resourceVersion"]
             for kind, name in (("service", "llama"), ("configmap", "llama-llm-api"))}
    assert after == {k: v for k, v in versions.items() if k != "deployment"}
    dep = get("deployment", "llama", ns) or {}
    assert dep["metadata"]["generation"] == dep["status"]["observedGeneration"]
    assert (get("inferenceengine", "llama", ns) or {})["metadata"]["resourceVersion"] == ie_version
