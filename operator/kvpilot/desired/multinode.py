"""The serving children of a multi-node engine: a LeaderWorkerSet, its SSH Secret, its scripts, its PDB.

An engine whose ranks (TP x PP) exceed ``serving.gpusPerNode`` runs as groups of ``nodes_per_replica`` pods,
one per node, each pod holding ``gpusPerNode`` GPUs; ``serving.replicas`` counts groups. The
LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, sigs.k8s.io/lws v0.9.0 api/leaderworkerset/v1) runs them:

- ``size`` = nodes, ``restartPolicy: RecreateGroupOnPodRestart`` (MPI cannot lose a rank: any pod or
  container restart recreates the whole group), ``startupPolicy: LeaderCreated`` (the workers start with the
  leader; ``LeaderReady`` would deadlock, the leader being Ready only once its workers serve).
- The leader runs trtllm/multinode.py's leader script: it waits for its workers' sshd, then mpirun starts
  every rank through ``trtllm-llmapi-launch``. Readiness, the Service and the metrics are the leader's only
  (workers carry component ``worker``, not ``server``). Its startup probe allows the workers' wait plus the
  model load, so liveness never judges a group that is still loading; workers have no liveness probe at all
  (a worker is only sshd and ranks the leader watches through MPI).
- ``rolloutStrategy`` rolls group by group: the rollout limits in force (desired/rollout.py) count groups.
- One PodDisruptionBudget over all the engine's pods, ``maxUnavailable: 1``: evicting one pod takes its whole
  group down (its pods stay unavailable until the group is Ready again), so this admits one disrupted group
  at a time. Budgets per group could not: each would allow one eviction, in every group at once.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import math
from typing import Any

from kvpilot.api.models import InferenceEngineSpec, ObjectRef
from kvpilot.desired import labels as L
from kvpilot.desired import pod_parts as P
from kvpilot.desired import serving
from kvpilot.desired import sshkeys
from kvpilot.desired.once import CreateOnce
from kvpilot.desired.sshkeys import SshKeys
from kvpilot.trtllm import multinode as MN

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_COMPONENT = "worker"
WORKER_GRACE_SECONDS = 30
# sshd as root: privilege separation chroots and changes user (the rest of ALL stays dropped).
SSHD_CAPABILITIES = ["SETUID", "SETGID", "SYS_CHROOT"]


def lws_name(name: str) -> str:
    """Not the engine's name: LWS names its headless Service after itself, and the engine's Service has that."""
    return f"{name}-lws"


def ssh_secret_name(owner: ObjectRef) -> str:
    """Named after the engine *and its UID* (issue 22): the operator may not read Secrets, so a create answered
    409 cannot say whose the Secret is; a name no other object can have taken before the engine existed makes
    that 409 the engine's own Secret (created before an operator restart), never someone else's, which the
    engine's pods would otherwise mount."""
    return f"{owner.name}-ssh-{hashlib.sha256(owner.uid.encode()).hexdigest()[:8]}"


def scripts_config_map_name(name: str) -> str:
    return f"{name}-multinode"


_meta = serving._meta  # the metadata every serving child carries (labels, owner)


def ssh_secret(owner: ObjectRef, spec: InferenceEngineSpec, keys: SshKeys) -> dict[str, Any]:
    """The engine's SSH keys (``keys``: read back from the Secret, or generated when it is absent)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(owner, ssh_secret_name(owner), spec, WORKER_COMPONENT),
        "type": "Opaque",
        # data, not stringData: the API server stores data only, and the diff compares what it stores.
        "data": {k: base64.b64encode(v.encode()).decode()
                 for k, v in keys.secret_data(f"kvpilot@{owner.namespace}.{owner.name}").items()},
    }


def scripts_config_map(owner: ObjectRef, spec: InferenceEngineSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, scripts_config_map_name(owner.name), spec, WORKER_COMPONENT),
        "data": MN.scripts(),
    }


def _group_volumes(owner: ObjectRef) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "ssh", "secret": {"secretName": ssh_secret_name(owner), "defaultMode": 0o400}},
        {"name": "multinode", "configMap": {"name": scripts_config_map_name(owner.name), "defaultMode": 0o555}},
    ]
    mounts = [
        {"name": "ssh", "mountPath": MN.SSH_DIR, "readOnly": True},
        {"name": "multinode", "mountPath": MN.SCRIPTS_DIR, "readOnly": True},
    ]
    return volumes, mounts


def _leader(template: dict[str, Any], spec: InferenceEngineSpec, owner: ObjectRef) -> dict[str, Any]:
    """The Deployment's pod template as the group's leader: rank 0 starts every rank with mpirun."""
    leader = copy.deepcopy(template)
    pod = leader["spec"]
    container = pod["containers"][0]
    gpus = spec.serving.gpus_per_node
    env = list(container.get("env") or [])
    exported = [e["name"] for e in env]
    container["env"] = env + MN.leader_env(gpus, exported)
    container["args"] = [*container["command"], *container.get("args", [])]
    container["command"] = MN.leader_command()
    container["resources"] = P.resources(spec.serving.resources, gpus)
    # The startup probe's budget: waiting for the workers, then the model load on every rank.
    period = serving.STARTUP_PROBE_PERIOD_SECONDS
    budget = spec.serving.startup_timeout_seconds + MN.WORKER_WAIT_SECONDS
    container["startupProbe"]["failureThreshold"] = math.ceil(budget / period)
    volumes, mounts = _group_volumes(owner)
    container["volumeMounts"] = container["volumeMounts"] + mounts
    pod["volumes"] = pod["volumes"] + volumes
    return leader


def _worker(template: dict[str, Any], spec: InferenceEngineSpec, owner: ObjectRef) -> dict[str, Any]:
    """A worker pod: sshd for the leader's mpirun, the node's GPUs, and what the ranks read (engine, model)."""
    worker = copy.deepcopy(template)
    worker["metadata"]["labels"] = L.common_labels(owner.name, spec.runtime.backend, WORKER_COMPONENT)
    worker["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] = WORKER_COMPONENT
    pod = worker["spec"]
    server = pod["containers"][0]
    volumes, mounts = _group_volumes(owner)
    keep = [m for m in server["volumeMounts"] if m["name"] != "llm-api"]
    security = P.container_security_context()
    security["capabilities"]["add"] = SSHD_CAPABILITIES
    pod["containers"] = [P.prune({
        "name": WORKER_COMPONENT,
        "image": server["image"],
        "command": MN.worker_command(),
        "ports": [{"name": "ssh", "containerPort": MN.SSH_PORT, "protocol": "TCP"}],
        "env": (server.get("env") or []) + MN.worker_env(),
        "resources": P.resources(spec.serving.resources, spec.serving.gpus_per_node),
        "volumeMounts": keep + mounts,
        "readinessProbe": {"tcpSocket": {"port": "ssh"}, "periodSeconds": 5, "failureThreshold": 3},
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })]
    pod.pop("affinity", None)  # the spread rule selects serving (leader) pods only
    pod["terminationGracePeriodSeconds"] = WORKER_GRACE_SECONDS
    pod["volumes"] = pod["volumes"] + volumes
    return worker


def leader_worker_set(owner: ObjectRef, spec: InferenceEngineSpec, deployment: dict[str, Any],
                      rolling_update: dict[str, int] | None = None) -> dict[str, Any]:
    """The LeaderWorkerSet serving what ``deployment`` (serving.deployment, rendered for this engine) would: its
    pod template becomes the group's leader, and workers are derived from it. ``rolling_update``: the limits in
    force, in groups (desired/rollout.py); None: the spec's."""
    template = deployment["spec"]["template"]
    limits = rolling_update or {"maxSurge": spec.serving.rollout.max_surge,
                                "maxUnavailable": spec.serving.rollout.max_unavailable}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _meta(owner, lws_name(owner.name), spec, "server"),
        "spec": {
            "replicas": spec.serving.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {**limits, "partition": 0},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": spec.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _leader(template, spec, owner),
                "workerTemplate": _worker(template, spec, owner),
            },
        },
    }


def pod_disruption_budget(owner: ObjectRef, spec: InferenceEngineSpec) -> dict[str, Any] | None:
    """One disrupted group at a time (module docstring); none for one group, which it would block forever."""
    if spec.serving.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, lws_name(owner.name), spec, "server"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {LWS_NAME_LABEL: lws_name(owner.name)}}},
    }


def serving_children(owner: ObjectRef, spec: InferenceEngineSpec, lws: dict[str, Any],
                     ) -> tuple[list[dict[str, Any]], tuple[CreateOnce, ...]]:
    """What a multi-node engine serves with besides its LLM-API ConfigMap, to apply (scripts, the LeaderWorkerSet
    ``lws``, Service, PDB), and its SSH Secret, created once with fresh keys and never read back."""
    pdb = pod_disruption_budget(owner, spec)
    secret = CreateOnce("Secret", owner.namespace, ssh_secret_name(owner),
                        lambda: ssh_secret(owner, spec, sshkeys.generate()))
    return [scripts_config_map(owner, spec), lws, serving.service(owner, spec), *([pdb] if pdb else [])], (secret,)
