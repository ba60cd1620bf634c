"""The typed models (spec and status) and the CRD schema agree field for field (and in optionality)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing

from kvpilot.api import models, status
from kvpilot.api.convert import dataclass_fields
from kvpilot.api.crd import spec_openapi

SCHEMA_TYPES = {"integer": int, "string": str, "boolean": bool}


def _unwrap(tp: typing.Any) -> tuple[typing.Any, bool]:
    """(inner type, optional?)"""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _enum_values(tp: typing.Any) -> tuple[str, ...] | None:
    """The values of a Literal or an Enum, None for any other type."""
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(m.value for m in tp)
    return None


def _compare(cls: type, schema: dict, path: str, problems: list[str], typed_enums: bool = False) -> None:
    """Problems where ``cls`` and ``schema`` differ; ``typed_enums``: a schema enum must be a Literal or Enum."""
    fields = dataclass_fields(cls)
    props = schema["properties"]
    for name in sorted(set(fields) - set(props)):
        problems.append(f"{path}.{name}: in {cls.__name__} but not in the schema")
    for name in sorted(set(props) - set(fields)):
        problems.append(f"{path}.{name}: in the schema but not in {cls.__name__}")
    model_fields = {_camel(f.name): f for f in dataclasses.fields(cls)}
    for name in sorted(set(fields) & set(props)):
        sub, tp = props[name], fields[name]
        inner, optional = _unwrap(tp)
        f = model_fields[name]
        has_model_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        schema_sure = "default" in sub or name in schema.get("required", [])
        if schema_sure and optional:
            problems.append(f"{path}.{name}: always present (default/required) but Optional in {cls.__name__}")
        if not schema_sure and not has_model_default:
            problems.append(f"{path}.{name}: may be absent but {cls.__name__} has no default for it")
        if dataclasses.is_dataclass(inner):
            _compare(inner, sub, f"{path}.{name}", problems, typed_enums)
        elif typing.get_origin(inner) is tuple:
            item = typing.get_args(inner)[0]
            assert sub["type"] == "array", f"{path}.{name}"
            if dataclasses.is_dataclass(item):
                _compare(item, sub["items"], f"{path}.{name}[]", problems, typed_enums)
        elif typing.get_origin(inner) is dict:
            if "additionalProperties" not in sub:
                problems.append(f"{path}.{name}: a dict in the model but not a map in the schema")
        elif (values := _enum_values(inner)) is not None:
            if sub.get("type") != "string" or sorted(values) != sorted(sub.get("enum", ())):
                problems.append(f"{path}.{name}: schema enum {sub.get('enum')} vs model {sorted(values)}")
        elif typed_enums and "enum" in sub:
            problems.append(f"{path}.{name}: an enumeration in the schema but {inner} in {cls.__name__}")
        elif "x-kubernetes-int-or-string" in sub:
            if inner is not str:
                problems.append(f"{path}.{name}: a quantity must be modelled as str")
        elif SCHEMA_TYPES.get(sub.get("type")) is not inner:
            problems.append(f"{path}.{name}: schema type {sub.get('type')} vs model {inner}")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def test_spec_models_match_the_crd_schema_field_for_field() -> None:
    problems: list[str] = []
    _compare(models.InferenceEngineSpec, spec_openapi()["properties"]["spec"], "spec", problems)
    assert problems == []


def test_the_parity_check_detects_a_missing_field() -> None:
    schema = spec_openapi()["properties"]["spec"]
    schema["properties"]["build"]["properties"]["extraFlag"] = {"type": "string", "description": "x"}
    problems: list[str] = []
    _compare(models.InferenceEngineSpec, schema, "spec", problems)
    assert problems == ["spec.build.extraFlag: in the schema but not in BuildSpec"]


def test_status_models_match_the_crd_schema_field_for_field() -> None:
    problems: list[str] = []
    _compare(status.EngineStatus, spec_openapi()["properties"]["status"], "status", problems, typed_enums=True)
    assert problems == []


def test_the_status_parity_check_detects_a_drifted_enumeration_and_a_missing_field() -> None:
    schema = spec_openapi()["properties"]["status"]
    schema["properties"]["build"]["properties"]["state"]["enum"].append("Queued")
    del schema["properties"]["kvCache"]["properties"]["pausedRequests"]
    problems: list[str] = []
    _compare(status.EngineStatus, schema, "status", problems, typed_enums=True)
    assert problems == [
        "status.build.state: schema enum ['Building', 'Succeeded', 'Failed', 'CacheHit', 'Queued'] vs model "
        "['Building', 'CacheHit', 'Failed', 'Succeeded']",
        "status.kvCache.pausedRequests: in KvCacheStatus but not in the schema",
    ]
