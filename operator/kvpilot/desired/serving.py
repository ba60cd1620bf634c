"""The serving children: the LLM-API ConfigMap, the Deployment of trtllm-serve pods, and the Service."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

import yaml

from kvpilot.api.models import InferenceEngineSpec, ObjectRef
from kvpilot.desired import labels as L
from kvpilot.desired import pod_parts as P
from kvpilot.trtllm.build import CACHE_MOUNT, MODEL_MOUNT
from kvpilot.trtllm.prepare import AUTOTUNER_FILE, WARMUP_DIR
from kvpilot.trtllm.release import AUTOTUNER_CACHE_ENV
from kvpilot.trtllm.serve import (
    CONFIG_DIR,
    CONFIG_FILE,
    ServedEngine,
    llm_api_options,
    serve_command,
    served_checkpoint,
)
from kvpilot.trtllm.surface import Surface

STARTUP_PROBE_PERIOD_SECONDS = 10
# Zero-loss restarts. When a pod is deleted, the endpoints controller, kube-proxy and gateways take a moment
# to stop routing to it; the preStop sleep keeps it serving meanwhile. Only then does trtllm-serve get
# SIGTERM: uvicorn stops accepting and finishes the requests in flight, within the drain budget.
PRE_STOP_SLEEP_SECONDS = 5
DRAIN_SECONDS = 120
TERMINATION_GRACE_SECONDS = PRE_STOP_SLEEP_SECONDS + DRAIN_SECONDS


def _meta(owner: ObjectRef, name: str, spec: InferenceEngineSpec, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": L.common_labels(owner.name, spec.runtime.backend, component),
        "ownerReferences": [L.owner_reference(owner)],
    }


def llm_api_config_map(
    owner: ObjectRef, spec: InferenceEngineSpec, engine: ServedEngine | None, max_batch_size: int,
    surface: Surface | None = None,
) -> dict[str, Any]:
    text = _yaml(llm_api_options(spec, engine, max_batch_size, surface))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, L.config_map_name(owner.name), spec, "server"),
        "data": {CONFIG_FILE: text},
    }


def _yaml(options: dict[str, Any]) -> str:
    """The LLM-API YAML of ``options``, memoized on their JSON (a C encoder): PyYAML's pure-Python dumper was
    ~40% of the operator's event-loop CPU while 3,000 engines rolled out, for a handful of distinct configs."""
    try:
        key = json.dumps(options)
    except (TypeError, ValueError):  # not plain JSON data: no key to memoize on
        return yaml.safe_dump(options, sort_keys=False)
    return _yaml_of_json(key)


@functools.lru_cache(maxsize=4096)
def _yaml_of_json(key: str) -> str:
    return yaml.safe_dump(json.loads(key), sort_keys=False)  # JSON keeps the keys' order: the same YAML


def config_hash(config_map: dict[str, Any]) -> str:
    """Pods roll when the LLM-API YAML changes (a mounted ConfigMap alone would not restart them)."""
    return _data_hash(tuple(sorted(config_map["data"].items())))


@functools.lru_cache(maxsize=4096)
def _data_hash(items: tuple[tuple[str, str], ...]) -> str:
    # Memoized: engines share a handful of configurations, and dumping YAML is slow (5% of a restart's CPU).
    return hashlib.sha256(yaml.safe_dump(dict(items), sort_keys=True).encode()).hexdigest()[:16]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


# Where serving pods keep their own copy of the prepared warm-up cache: the PyTorch kernel autotuner writes its cache
# back at the end of every warm-up (and raises when it cannot), so it cannot point into the read-only engine cache.
WARM_MOUNT = "/var/cache/kvpilot"


def _serves_model_claim(spec: InferenceEngineSpec, engine: ServedEngine | None) -> bool:
    """The pods read a pvc:// checkpoint in place: served directly, or prepared without a copy."""
    if P.model_volume(spec) is None:
        return False
    if not spec.builds_engine:
        return True
    return engine is not None and spec.prepares_checkpoint and served_checkpoint(spec, engine).startswith(MODEL_MOUNT)


def _volumes(
    owner: ObjectRef, spec: InferenceEngineSpec, claim: str | None, engine: ServedEngine | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every pod mounts the engine cache read-only: engines and prepared checkpoints are published once by their
    Job and never written by a pod (a ReadWriteOnce claim can then still serve pods on one node, and replicas
    never race a download)."""
    volumes: list[dict[str, Any]] = [{"name": "llm-api", "configMap": {"name": L.config_map_name(owner.name)}}]
    mounts: list[dict[str, Any]] = [{"name": "llm-api", "mountPath": CONFIG_DIR, "readOnly": True}]
    if claim and spec.builds_engine:
        volumes.append(P.cache_volume(claim, read_only=True))
        mounts.append(P.cache_mount(read_only=True))
    if spec.prepares_checkpoint:
        volumes.append({"name": "warm", "emptyDir": {}})
        mounts.append({"name": "warm", "mountPath": WARM_MOUNT})
    model = P.model_volume(spec)
    if model is not None and _serves_model_claim(spec, engine):
        volumes.append(model)
        mounts.append(P.model_mount())
    if spec.model.scheme == "s3" and not spec.builds_engine:
        volumes.append({"name": "model", "emptyDir": {}})
        mounts.append({"name": "model", "mountPath": "/model"})
    shm = P.shm_volume(spec.build.gpus)
    if shm:
        volumes.append(shm[0])
        mounts.append(shm[1])
    return volumes, mounts


def deployment(
    owner: ObjectRef,
    spec: InferenceEngineSpec,
    engine: ServedEngine | None,
    *,
    image: str,
    claim: str | None,
    max_batch_size: int,
    config_map: dict[str, Any],
    rolling_update: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``rolling_update``: the limits in force (desired/rollout.py); None: the spec's maxSurge/maxUnavailable."""
    s = spec.serving
    gpus = engine.tensor_parallel_size * engine.pipeline_parallel_size if engine else spec.build.gpus
    command = serve_command(spec, engine, max_batch_size)
    volumes, mounts = _volumes(owner, spec, claim, engine)
    env = P.env(spec)
    if spec.prepares_checkpoint:
        env.append({"name": AUTOTUNER_CACHE_ENV, "value": f"{WARM_MOUNT}/{AUTOTUNER_FILE}"})
    labels = L.common_labels(owner.name, spec.runtime.backend, "server")
    annotations = {
        L.CONFIG_HASH_ANNOTATION: config_hash(config_map),
        L.BATCH_ANNOTATION: command.argv[command.argv.index("--max_batch_size") + 1],
        "kubectl.kubernetes.io/default-container": "server",
    }
    if engine is not None:
        annotations[L.FINGERPRINT_ANNOTATION] = engine.fingerprint
    init = None
    if spec.model.scheme == "s3" and not spec.builds_engine:
        init = [P.s3_sync_container(spec, "/model", [{"name": "model", "mountPath": "/model"}])]
    if spec.prepares_checkpoint and engine is not None:
        init = [_warm_cache_container(spec, engine, image)]
    container = {
        "name": "server",
        "image": image,
        "command": [command.argv[0]],
        "args": list(command.argv[1:]),
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        "env": (env + (P.credentials_env(spec) if not spec.builds_engine else [])) or None,  # only a download needs them
        "resources": P.resources(s.resources, gpus),
        "volumeMounts": mounts,
        # Model load can take many minutes: the startup probe owns that budget so liveness stays strict.
        "startupProbe": _probe(
            "/health", STARTUP_PROBE_PERIOD_SECONDS, math.ceil(s.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS)
        ),
        # Readiness asks whether the engine can take traffic now (/health answers 503 once the executor is
        # unhealthy); liveness only whether the HTTP server still answers at all (/version does no engine
        # work), so a busy or briefly unhealthy engine leaves the Service but is not restarted mid-request.
        "readinessProbe": _probe("/health", 5, 2),
        "livenessProbe": _probe("/version", 15, 4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_SECONDS)]}}},
        "securityContext": P.container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, L.deployment_name(owner.name), spec, "server"),
        "spec": {
            "replicas": s.replicas,
            "selector": {"matchLabels": L.server_selector(owner.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": rolling_update
                or {"maxSurge": s.rollout.max_surge, "maxUnavailable": s.rollout.max_unavailable},
            },
            "progressDeadlineSeconds": s.startup_timeout_seconds + 600,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "nodeSelector": P.node_selector(spec),
                    "tolerations": P.tolerations(spec),
                    # Spread replicas over nodes when the GPUs allow (preferred, so tight clusters still
                    # schedule). Rendered for any replica count: a scale-up must not change the template.
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {"labelSelector": {"matchLabels": L.server_selector(owner.name)},
                                            "topologyKey": "kubernetes.io/hostname"},
                    }]}},
                    "priorityClassName": s.priority_class_name,
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "automountServiceAccountToken": False,  # trtllm-serve never talks to the API server
                    "securityContext": P.pod_security_context(spec),
                    "initContainers": init,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    pruned: dict[str, Any] = P.prune(dep)
    return pruned


def _warm_cache_container(spec: InferenceEngineSpec, engine: ServedEngine, image: str) -> dict[str, Any]:
    """Copies the prepared warm-up cache (the kernel autotuner's) out of the read-only engine cache, so the server
    loads it and may write back what it tunes anew (another limit's shapes) without touching the shared copy."""
    src = f"{CACHE_MOUNT}/{engine.fingerprint}/{WARMUP_DIR}/."
    return {
        "name": "warm-cache",
        "image": image,
        "command": ["cp", "-R", src, f"{WARM_MOUNT}/"],
        "volumeMounts": [P.cache_mount(read_only=True), {"name": "warm", "mountPath": WARM_MOUNT}],
        "resources": {"requests": {P.EPHEMERAL_STORAGE: "64Mi"}, "limits": {P.EPHEMERAL_STORAGE: "1Gi"}},
        "securityContext": P.container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def service(owner: ObjectRef, spec: InferenceEngineSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, L.service_name(owner.name), spec, "server"),
        "spec": {
            "type": "ClusterIP",
            "selector": L.server_selector(owner.name),
            "ports": [{"name": "http", "port": spec.serving.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pod_disruption_budget(owner: ObjectRef, spec: InferenceEngineSpec) -> dict[str, Any] | None:
    """With several replicas, a node drain may evict only one serving pod at a time (like the default
    rollout), so voluntary disruptions never take every replica at once. One replica gets none: a PDB
    would then block drains forever. A PDB left from a larger replica count allows one eviction, which
    for a single replica is no block either."""
    if spec.serving.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, L.deployment_name(owner.name), spec, "server"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": L.server_selector(owner.name)}},
    }


def endpoint(owner: ObjectRef, spec: InferenceEngineSpec) -> str:
    return f"http://{L.service_name(owner.name)}.{owner.namespace}.svc:{spec.serving.port}/v1"
