"""Renders the InferenceEngine CustomResourceDefinition from the schemas in this package.

``make crds`` writes it to ``crds/`` and the Helm chart; a unit test fails when the committed files
drift from what this module renders.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvpilot import GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION, __version__
from kvpilot.api.openapi import Rule
from kvpilot.api.spec_schema import spec_schema
from kvpilot.api.status_schema import status_schema

NAME_MAX = 52
ROOT_RULES = (
    Rule(
        f"self.metadata.name.size() <= {NAME_MAX} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name must be a DNS-1035 label of at most {NAME_MAX} characters (lower-case letters, digits and "
        "'-', starting with a letter): the Service and Deployment are named after it",
    ),
)

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].status',
     "description": "Whether the engine serves (Available condition)."},
    {"name": "Backend", "type": "string", "jsonPath": ".spec.runtime.backend", "description": "Runtime backend."},
    {"name": "Batch", "type": "string", "jsonPath": ".status.batching.summary",
     "description": "Runtime max_batch_size / engine ceiling."},
    {"name": "KV%", "type": "integer", "jsonPath": ".status.kvCache.utilizationPercent",
     "description": "KV-cache pool utilization."},
    {"name": "Model", "type": "string", "jsonPath": ".status.autotune.model.trust",
     "description": "Whether the tuner trusts its engine model: Trusted, Distrusted (measured-only decisions) or "
                    "Calibrating."},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas",
     "description": "Ready replicas: pods, or groups of a multi-node engine."},
    # Multi-node only, so shown with -o wide: most engines are one pod, and two empty columns would crowd them.
    {"name": "Groups", "type": "string", "jsonPath": ".status.groups.summary", "priority": 1,
     "description": "Multi-node engines: ready groups / groups."},
    {"name": "Pods/Group", "type": "integer", "jsonPath": ".status.groups.podsPerGroup", "priority": 1,
     "description": "Multi-node engines: pods (nodes) per group."},
    {"name": "Engine", "type": "string", "jsonPath": ".status.engine.fingerprint", "priority": 1,
     "description": "Fingerprint of the engine in service."},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].reason',
     "priority": 1, "description": "Why it is (not) available."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CRD as a dict, ready for ``yaml.safe_dump`` or server-side apply."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "kvpilot", "app.kubernetes.io/version": __version__},
            # Helm must not delete the CRD (and with it every InferenceEngine) on uninstall.
            "annotations": {"helm.sh/resource-policy": "keep"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": ["kvpilot", "ai"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.serving.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A TensorRT-LLM model served on GPUs: kvpilot builds its engine, rolls out "
                            "trtllm-serve pods and retunes max_batch_size from the KV-cache pool.",
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version of the object."},
                                "kind": {"type": "string", "description": "Kind of the object."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            "required": ["spec"],
                            "x-kubernetes-validations": [r.to_schema() for r in ROOT_RULES],
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `kvpilot crd` from operator/kvpilot/api/ — do not edit by hand; run `make crds`.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def spec_openapi() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema
