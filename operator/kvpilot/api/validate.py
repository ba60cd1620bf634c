"""Offline admission: default and validate an InferenceEngine manifest exactly as the API server would.

``kvpilot render`` must reject what ``kubectl apply`` rejects, with the same field paths and messages, so
this module walks the very schema the CRD is generated from and evaluates the very same CEL rules (with
cel-python). The end-to-end tests check both agree on a table of invalid manifests.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import celpy
from celpy.adapter import json_to_cel
import re2  # the API server's regex engine (Go's regexp is RE2), shipped with cel-python: `$` is end of text

from kvpilot import API_VERSION, KIND
from kvpilot.api.openapi import Schema

DNS1123_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SHOWN_MAX = 80  # characters of a value echoed in an error: a 10 MB value must not be printed whole
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # JSON numbers the API server decodes as integers


@dataclass(frozen=True)
class FieldError:
    """One violation, phrased like the API server's field errors."""

    path: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.path}: Invalid value: {shown(self.value)}: {self.message}"


def shown(value: Any) -> str:
    """A value as an error echoes it: containers by kind, long text cut with its full length."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    text = repr(value)
    if len(text) > SHOWN_MAX:
        size = len(value) if isinstance(value, (str, bytes)) else len(text)
        return f"{text[:SHOWN_MAX]}... ({size} characters)"
    return text


class InvalidEngineError(ValueError):
    """Raised with every violation of an InferenceEngine manifest."""

    def __init__(self, name: str, errors: list[FieldError], where: str = ""):
        self.name = name
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        prefix = f"{where}: " if where else ""
        super().__init__(f'{prefix}InferenceEngine "{name}" is invalid:\n{lines}')


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Fill absent fields with their schema defaults, top-down, as structural defaulting does."""
    if not isinstance(value, dict) or "properties" not in schema:
        if isinstance(value, list) and "items" in schema:
            return [apply_defaults(schema["items"], v) for v in value]
        return value
    # The API server prunes null fields of a non-nullable schema before defaulting: `replicas: null` is absent.
    out = {k: v for k, v in value.items() if v is not None or schema["properties"].get(k, {}).get("nullable")}
    for name, sub in schema["properties"].items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = apply_defaults(sub, out[name])
    return out


@lru_cache(maxsize=None)
def _program(cel: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(cel))


def _cel_holds(cel: str, value: Any) -> bool:
    return bool(_program(cel).evaluate({"self": json_to_cel(value)}))


def _type_errors(schema: Schema, value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return [FieldError(path, value, "must be of type integer (a 64-bit integer)")]
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [FieldError(path, value, "must be an integer or a string")]
        if isinstance(value, str) and not re2.search(schema["pattern"], value):
            return [FieldError(path, value, "must be a quantity such as 500m, 16Gi or 4")]
        return []
    expected = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if expected in checks and not checks[expected](value):
        return [FieldError(path, value, f"must be of type {expected}")]
    return []


def _scalar_errors(schema: Schema, value: Any, path: str) -> list[FieldError]:
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{v}"' for v in schema["enum"])
        errors.append(FieldError(path, value, f"must be one of {allowed}"))
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(FieldError(path, value, f"must be >= {schema['minimum']}"))
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(FieldError(path, value, f"must be <= {schema['maximum']}"))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError(path, value, f"must have at most {schema['maxLength']} characters"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(FieldError(path, value, f"must have at least {schema['minLength']} characters"))
        if "pattern" in schema and not re2.search(schema["pattern"], value):
            errors.append(FieldError(path, value, f"must match '{schema['pattern']}'"))
    return errors


def _object_errors(schema: Schema, value: dict[str, Any], path: str, cel: bool = True) -> list[FieldError]:
    errors = []
    for name in schema.get("required", []):
        if name not in value:
            errors.append(FieldError(f"{path}.{name}", None, "Required value"))
    if "properties" in schema:
        for name, sub_value in value.items():
            if name not in schema["properties"]:
                errors.append(FieldError(f"{path}.{name}", sub_value, "unknown field"))
            else:
                errors.extend(validate_value(schema["properties"][name], sub_value, f"{path}.{name}", cel))
    if "additionalProperties" in schema:
        if len(value) > schema.get("maxProperties", len(value)):
            errors.append(FieldError(path, value, f"must have at most {schema['maxProperties']} entries"))
        for name, sub_value in value.items():
            errors.extend(validate_value(schema["additionalProperties"], sub_value, f"{path}.{name}", cel))
    return errors


def validate_value(schema: Schema, value: Any, path: str, cel: bool = True) -> list[FieldError]:
    """Every violation of ``schema`` by ``value`` (already defaulted), CEL rules included unless ``cel`` is
    False (the structural checks are cheap; the CEL rules cost ~10 ms per engine)."""
    errors = _type_errors(schema, value, path)
    if errors:
        return errors
    if isinstance(value, dict):
        errors = _object_errors(schema, value, path, cel)
    elif isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors = [FieldError(path, value, f"must have at most {schema['maxItems']} items")]
        for i, item in enumerate(value):
            errors.extend(validate_value(schema["items"], item, f"{path}[{i}]", cel))
    else:
        errors = _scalar_errors(schema, value, path)
    for rule in schema.get("x-kubernetes-validations", []) if cel else ():
        try:
            holds = _cel_holds(rule["rule"], value)
        except Exception:  # noqa: BLE001 — a rule over fields that already failed their own checks
            continue
        if not holds:
            errors.append(FieldError(path + rule.get("fieldPath", ""), value, rule_message(rule, value)))
    return errors


def rule_message(rule: dict[str, Any], value: Any) -> str:
    """The rule's ``messageExpression`` evaluated as the API server does (a string naming the offending value),
    else its ``message`` (also when the expression fails or yields no string, as the API server falls back)."""
    expression = rule.get("messageExpression")
    if not expression:
        return str(rule["message"])
    try:
        text = _program(expression).evaluate({"self": json_to_cel(value)})
    except Exception:  # noqa: BLE001 — the API server falls back to the static message too
        return str(rule["message"])
    return str(text) if isinstance(text, str) and text.strip() else str(rule["message"])


def validate_manifest(manifest: Any, root_schema: Schema, cel: bool = True) -> tuple[dict[str, Any], list[FieldError]]:
    """Default the manifest and collect every error: identity, metadata.name, spec (CEL rules unless ``cel``
    is False)."""
    if not isinstance(manifest, dict):
        return {}, [FieldError("<document>", manifest, "must be a YAML mapping")]
    errors: list[FieldError] = []
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", manifest.get("apiVersion"), f'must be "{API_VERSION}"'))
    if manifest.get("kind") != KIND:
        errors.append(FieldError("kind", manifest.get("kind"), f'must be "{KIND}"'))
    meta = manifest.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        errors.append(FieldError("metadata", meta, "must be of type object"))
        meta = {}
    name = meta.get("name")
    namespace = meta.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and len(namespace) <= 63
                                      and re2.search(DNS1123_LABEL, namespace)):
        errors.append(FieldError("metadata.namespace", namespace, "must be a DNS-1123 label of at most 63 characters"))
    if name is not None and not isinstance(name, str):
        errors.append(FieldError("metadata.name", name, "must be of type string"))
    elif not name:
        errors.append(FieldError("metadata.name", name, "Required value"))
    else:
        for rule in root_schema.get("x-kubernetes-validations", []) if cel else ():  # a rule on the name: CEL
            if not _cel_holds(rule["rule"], {"metadata": {"name": name}}):
                errors.append(FieldError("metadata.name", name, rule["message"]))
    for key in manifest:
        if key not in ("apiVersion", "kind", "metadata", "spec", "status"):
            errors.append(FieldError(key, manifest[key], "unknown field"))
    spec_schema = root_schema["properties"]["spec"]
    if manifest.get("spec") is None:  # absent, or null (pruned by the API server)
        errors.append(FieldError("spec", None, "Required value"))
        return manifest, errors
    spec = apply_defaults(spec_schema, manifest["spec"])
    errors.extend(validate_value(spec_schema, spec, "spec", cel))
    return {**manifest, "spec": spec}, errors
