"""camelCase API dicts <-> snake_case frozen dataclasses, driven by the dataclasses' type hints.

A generic converter keeps the models declarative: adding a field to the schema and the dataclass is the
whole change, and the parity test catches a field added to only one of them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


def camel(name: str) -> str:
    """``kv_cache_free_gpu_memory_percent`` -> ``kvCacheFreeGpuMemoryPercent``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def optional_of(tp: Any) -> Any | None:
    """``X`` for ``X | None`` (the models' only unions), None for any other type."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return None
    (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return inner


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if (inner := optional_of(tp)) is not None:
        return None if value is None else _convert(inner, value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        return tuple(_convert(item_tp, v) for v in value)
    if origin is dict:
        return {str(k): str(v) for k, v in value.items()}
    if tp is int and isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


_FIELDS: dict[type, tuple[tuple[str, str, Any], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(field name, camelCase key, resolved type) of a dataclass. Resolving the string annotations is most of
    a parse (a third of the operator's restart at 1,000 engines) and never changes: once per class."""
    out = _FIELDS.get(cls)
    if out is None:
        hints = typing.get_type_hints(cls)
        out = _FIELDS[cls] = tuple((f.name, camel(f.name), hints[f.name])
                                   for f in dataclasses.fields(cls))
    return out


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Instantiate dataclass ``cls`` from a camelCase dict; missing keys fall back to the field default."""
    kwargs: dict[str, Any] = {}
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    for name, key, tp in _fields(cls):
        if key in data:
            kwargs[name] = _convert(tp, data[key])
    return cls(**kwargs)


def dataclass_fields(cls: type) -> dict[str, Any]:
    """Field name (camelCase) -> resolved type, for the schema parity test."""
    hints = typing.get_type_hints(cls)
    return {camel(f.name): hints[f.name] for f in dataclasses.fields(cls)}
