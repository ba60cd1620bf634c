"""Small builders for OpenAPI v3 structural schemas.

The CRD is generated from Python (``kvpilot crd``) so that the schema, the local validator used by
``kvpilot render`` and the typed models share one definition of every field, default and bound.
These helpers keep each field a one-liner and make a missing description impossible: every builder
takes the description first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]

# Kubernetes quantities ("500m", "16Gi", 4): the same regular expression the apiserver uses for resources.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule attached to the object it is declared on.

    ``message`` is what the user reads when admission rejects the object, so it says what must hold.
    ``field_path`` (relative, e.g. ``.maxBatchSize``) points the error at the offending field.
    """

    cel: str
    message: str
    field_path: str | None = None
    message_expression: str | None = None  # CEL for a message that names the value (message is its fallback)

    def to_schema(self) -> Schema:
        out: Schema = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _with(schema: Schema, default: Any = None, rules: tuple[Rule, ...] = ()) -> Schema:
    if default is not None:
        schema["default"] = default
    if rules:
        schema["x-kubernetes-validations"] = [r.to_schema() for r in rules]
    return schema


def obj(
    description: str,
    properties: dict[str, Schema],
    required: tuple[str, ...] = (),
    default: Any = None,
    rules: tuple[Rule, ...] = (),
) -> Schema:
    """An object with a closed set of properties (unknown fields are pruned or rejected)."""
    schema: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = list(required)
    return _with(schema, default, rules)


def integer(
    description: str,
    minimum: int | None = None,
    maximum: int | None = None,
    default: int | None = None,
    rules: tuple[Rule, ...] = (),
    fmt: str = "int32",
) -> Schema:
    schema: Schema = {"type": "integer", "format": fmt, "description": description}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return _with(schema, default, rules)


def string(
    description: str,
    max_length: int = 253,
    enum: tuple[str, ...] | None = None,
    default: str | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    rules: tuple[Rule, ...] = (),
    fmt: str | None = None,
) -> Schema:
    schema: Schema = {"type": "string", "description": description}
    if enum is not None:
        schema["enum"] = list(enum)
    else:
        schema["maxLength"] = max_length
    if min_length is not None:
        schema["minLength"] = min_length
    if pattern is not None:
        schema["pattern"] = pattern
    if fmt is not None:
        schema["format"] = fmt
    return _with(schema, default, rules)


def boolean(description: str, default: bool | None = None) -> Schema:
    schema: Schema = {"type": "boolean", "description": description}
    if default is not None:
        schema["default"] = default
    return schema


# What the API server refuses in a container's resources or a claim's storage request (issue 13: admission
# let through what the Job, Deployment or PVC create then failed on).
NON_NEGATIVE = Rule("type(self) == string ? !self.startsWith('-') : self >= 0", "must be >= 0")
POSITIVE = Rule("type(self) == string ? self.matches('^[+]?[0-9.]*[1-9]') : self > 0", "must be > 0")
RESOURCE_NAME = Rule(
    "self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || k.matches('^hugepages-[0-9]+[KMGTPE]?i?$') || "
    "(k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
    "[A-Za-z0-9])?$') && k.size() <= 317))",
    "every key must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as "
    "example.com/device (GPUs follow the parallel sizes)",
)


def quantity(description: str, rule: Rule = NON_NEGATIVE) -> Schema:
    return {
        "description": description,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [rule.to_schema()],
    }


def string_map(description: str, max_properties: int = 64, value_max_length: int = 1024) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": max_properties,
        "additionalProperties": {"type": "string", "maxLength": value_max_length},
    }


def quantity_map(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": 16,
        "additionalProperties": quantity("A quantity such as 500m, 16Gi or 4."),
        "x-kubernetes-validations": [RESOURCE_NAME.to_schema()],
    }


def array(description: str, items: Schema, max_items: int, list_type: str = "atomic") -> Schema:
    return {
        "type": "array",
        "description": description,
        "items": items,
        "maxItems": max_items,
        "x-kubernetes-list-type": list_type,
    }


def map_list(description: str, items: Schema, keys: tuple[str, ...], max_items: int) -> Schema:
    schema = array(description, items, max_items, list_type="map")
    schema["x-kubernetes-list-map-keys"] = list(keys)
    return schema


def resources(description: str) -> Schema:
    """Requests and limits of cpu and memory (GPUs are derived from the parallel sizes, never asked for)."""
    return obj(
        description,
        {
            "requests": quantity_map("Minimum resources, e.g. cpu: 8, memory: 64Gi."),
            "limits": quantity_map("Maximum resources."),
        },
        default={},
    )


def walk_properties(schema: Schema, path: str = "") -> dict[str, Schema]:
    """Every property of a schema by dotted path (``spec.build.maxBatchSize``), objects included.

    Array items are walked under ``path[]`` so list entries are checked too.
    """
    out: dict[str, Schema] = {}
    for name, sub in schema.get("properties", {}).items():
        child = f"{path}.{name}" if path else name
        out[child] = sub
        out.update(walk_properties(sub, child))
        if sub.get("type") == "array":
            out.update(walk_properties(sub["items"], child + "[]"))
    return out


def expand_object_defaults(schema: Schema) -> Schema:
    """Replace ``default: {}`` on objects with the object their children's defaults make.

    The API server checks a default against the object's CEL rules *as written*, without applying the
    children's defaults first, so ``{}`` fails a rule such as ``self.maxSurge + self.maxUnavailable >= 1``.
    """
    for sub in schema.get("properties", {}).values():
        expand_object_defaults(sub)
        if sub.get("type") == "object" and sub.get("default") == {}:
            sub["default"] = {
                name: child["default"] for name, child in sub.get("properties", {}).items() if "default" in child
            }
    if schema.get("type") == "array" and "items" in schema:
        expand_object_defaults(schema["items"])
    return schema
