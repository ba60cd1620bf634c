"""Names and labels of the children of one InferenceEngine."""

from __future__ import annotations

import hashlib
from typing import Any

from kvpilot import API_VERSION, KIND
from kvpilot.api.models import ObjectRef

ENGINE_LABEL = "serving.kvpilot.io/engine"
BACKEND_LABEL = "serving.kvpilot.io/backend"
FINGERPRINT_LABEL = "serving.kvpilot.io/fingerprint"
FINGERPRINT_ANNOTATION = "serving.kvpilot.io/fingerprint"
CONFIG_HASH_ANNOTATION = "serving.kvpilot.io/config-hash"
BATCH_ANNOTATION = "serving.kvpilot.io/max-batch-size"
COMPONENT_LABEL = "app.kubernetes.io/component"
# On the canary Deployment and its pods (autotune/canary.py): the Service selects them with the others (its
# selector is the engine's and the component's), the canary Deployment only them.
CANARY_LABEL = "serving.kvpilot.io/canary"
MANAGED_BY = {"app.kubernetes.io/managed-by": "kvpilot"}


def common_labels(name: str, backend: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "inference-engine",
        "app.kubernetes.io/instance": name,
        COMPONENT_LABEL: component,
        **MANAGED_BY,
        ENGINE_LABEL: name,
        BACKEND_LABEL: backend,
    }


def server_selector(name: str) -> dict[str, str]:
    """Matches the serving pods of one InferenceEngine (and nothing it builds)."""
    return {ENGINE_LABEL: name, COMPONENT_LABEL: "server"}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(server_selector(name).items()))


def owner_reference(owner: ObjectRef, controller: bool = True) -> dict[str, Any]:
    """Children die with their InferenceEngine (garbage collection); shared build Jobs have several
    non-controller owners and die with the last of them."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def deployment_name(name: str) -> str:
    return name


def canary_deployment_name(name: str) -> str:
    """A canary retune's Deployment (autotune/canary.py). Not ``<name>-canary``: that is the Deployment of an
    engine named ``<name>-canary``, a name users give."""
    return f"{name}-kvpilot-canary"


def canary_config_map_name(name: str) -> str:
    return f"{name}-kvpilot-canary-llm-api"


def service_name(name: str) -> str:
    return name


def config_map_name(name: str) -> str:
    return f"{name}-llm-api"


def build_job_name(fingerprint: str, claim: str | None, claim_uid: str = "") -> str:
    """Named by fingerprint and cache claim, not by InferenceEngine: engines with the same build inputs that
    cache on the same claim share one Job (an engine on another claim needs its own copy built there).

    The claim's UID, once known, is part of the name: a claim deleted and re-created under the same name is
    empty, and the Job that filled its predecessor must not stand for a build on it."""
    key = f"{fingerprint}/{claim or ''}" + (f"/{claim_uid}" if claim_uid else "")
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"kvpilot-build-{digest[:10]}"


def engine_index_entry_name(claim: str, fingerprint: str) -> str:
    """One engine-index ConfigMap per (claim, fingerprint): small, written once, read from the watch cache."""
    digest = hashlib.sha256(f"{fingerprint}/{claim}".encode()).hexdigest()
    return f"kvpilot-engine-{digest[:16]}"


def created_claim_name(name: str) -> str:
    return f"{name}-engines"
