"""The operator's RBAC contract: what it needs, per scope. One table for the rendered-output tests and
the install test on a real API server; docs/install.md explains every line."""

from __future__ import annotations

READ = frozenset({"get", "list", "watch"})
MANAGE = READ | {"create", "patch"}  # server-side apply; the garbage collector deletes

# What the operator needs in every namespace whose InferenceEngines it reconciles.
NAMESPACED_NEEDS = {
    ("serving.kvpilot.io", "inferenceengines"): READ,  # never written: no finalizer, no annotations
    ("serving.kvpilot.io", "inferenceengines/status"): frozenset({"get", "patch"}),
    ("serving.kvpilot.io", "inferenceengines/finalizers"): frozenset({"update"}),
    ("batch", "jobs"): READ | {"create", "patch"},
    ("apps", "deployments"): MANAGE,
    ("apps", "replicasets"): READ,  # a pod counts only through its ReplicaSet to the engine's Deployment
    ("", "services"): MANAGE,
    ("", "configmaps"): MANAGE,
    ("", "persistentvolumeclaims"): MANAGE,
    ("policy", "poddisruptionbudgets"): MANAGE,
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): MANAGE,  # multi-node engines
    ("", "secrets"): frozenset({"create"}),  # their SSH keys: created once, never read
    ("", "pods"): READ,
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
}
# kopf 1.45 watches CRDs in every mode (kopf/_core/reactor/observation.py, resource_observer).
KOPF_CLUSTER_READS = {("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"})}
# With explicit namespaces kopf also lists/watches namespaces (observation.py, namespace_observer);
# cluster-wide it does not.
NAMESPACED_MODE_CLUSTER_READS = {**KOPF_CLUSTER_READS, ("", "namespaces"): frozenset({"list", "watch"})}
# serving.rollout.strategy Auto (gpuCapacity.watch, default on): free GPUs per node, from Nodes and the pods
# bound to them in every namespace (k8s/capacity.py). Cluster-wide list/watch, in both modes.
GPU_CAPACITY_READS = {("", "nodes"): frozenset({"list", "watch"}), ("", "pods"): frozenset({"list", "watch"})}
# What each mode grants at cluster scope, all together (pods: the namespaced READ covers the capacity watch).
CLUSTER_WIDE_MODE_GRANTS = {**NAMESPACED_NEEDS, **KOPF_CLUSTER_READS, **GPU_CAPACITY_READS, ("", "pods"): READ}
NAMESPACED_MODE_CLUSTER_GRANTS = {**NAMESPACED_MODE_CLUSTER_READS, **GPU_CAPACITY_READS}
# In a namespace nobody watches, namespaced mode can still list/watch pods (the capacity watch) and nothing else.
UNWATCHED_NAMESPACE_GRANTS = {("", "pods"): frozenset({"list", "watch"})}

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "bind", "escalate", "impersonate"})
