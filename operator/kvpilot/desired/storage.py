"""The engine cache claim (when the operator creates it) and the engine index that records what it holds."""

from __future__ import annotations

import json
from typing import Any

from kvpilot.api.models import InferenceEngineSpec, ObjectRef
from kvpilot.desired import labels as L


def cache_claim_name(owner: ObjectRef, spec: InferenceEngineSpec) -> str | None:
    cache = spec.engine_cache
    if cache is None:
        return None
    return cache.claim_name or L.created_claim_name(owner.name)


RETENTION_ANNOTATION = "serving.kvpilot.io/retention"


def cache_claim(owner: ObjectRef, spec: InferenceEngineSpec) -> dict[str, Any] | None:
    """A claim to create, only when the spec asks for one by size; an existing claim is never touched.

    It has no owner and names no engine: other InferenceEngines may cache on it (by claimName), so deleting
    the one that created it must not delete their engines (issue 13). Like a StatefulSet's volume claims it
    is retained; docs/engine-cache.md says how to prune it. Every engine that shares it renders the very same
    object, so their server-side applies agree (and, under the same field manager, drop the owner reference
    that older kvpilot versions set).
    """
    cache = spec.engine_cache
    if cache is None or cache.size is None:
        return None
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache_claim_name(owner, spec),
            "namespace": owner.namespace,
            "labels": {**L.MANAGED_BY, "app.kubernetes.io/name": "inference-engine",
                       L.COMPONENT_LABEL: "engine-cache"},
            "annotations": {RETENTION_ANNOTATION: "kept when the InferenceEngines that use it are deleted; "
                            "delete it to free the engines it holds (docs/engine-cache.md)"},
        },
        "spec": {
            "accessModes": [cache.access_mode],
            "resources": {"requests": {"storage": str(cache.size)}},
        },
    }
    if cache.storage_class_name:
        claim["spec"]["storageClassName"] = cache.storage_class_name
    return claim


INDEX_MANIFEST_KEY = "manifest.json"
INDEX_CLAIM_UID_KEY = "claimUID"


def engine_index_entry(
    namespace: str, claim: str, claim_uid: str, fingerprint: str, manifest: dict[str, Any]
) -> dict[str, Any]:
    """One published engine: a ConfigMap per (claim, fingerprint), replacing the one ConfigMap per claim that
    grew with every fingerprint and was read whole on every pass.

    It records the claim's UID: an entry made for a claim that was since deleted and re-created (empty) under
    the same name does not count as a cache hit. It has no owner: it describes the volume, which outlives any
    one InferenceEngine.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": L.engine_index_entry_name(claim, fingerprint),
            "namespace": namespace,
            "labels": {**L.MANAGED_BY, L.COMPONENT_LABEL: "engine-index", "serving.kvpilot.io/claim": claim[:63],
                       L.FINGERPRINT_LABEL: fingerprint[:63]},
            "annotations": {"serving.kvpilot.io/description": f"Engine {fingerprint[:10]} published on claim {claim}"},
        },
        "data": {
            "fingerprint": fingerprint,
            "claim": claim,
            INDEX_CLAIM_UID_KEY: claim_uid,
            INDEX_MANIFEST_KEY: json.dumps(manifest, sort_keys=True),
        },
    }
