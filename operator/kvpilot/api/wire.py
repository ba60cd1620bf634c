"""Status models <-> their camelCase wire form: the generic converter behind ``api/status.py``.

Any frozen dataclass of the status models converts: field names are the snake_case of the wire keys, a field's
type hint decides how its raw value is read. Reading never raises (status is user-writable): a value of the
wrong type or outside its enumeration reads as absent, a list item that is not a well-formed record is dropped,
a record missing a required field is not a record.
"""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum
from typing import Any, Callable, Literal, TypeVar

from kvpilot.api.convert import camel, optional_of

T = TypeVar("T")


class _Invalid:
    """A value that does not fit its field (read as absent)."""


_INVALID = _Invalid()

Parser = Callable[[object], object]  # raw JSON value -> model value, or _INVALID


def parse_record(cls: type[T], raw: object) -> T | None:
    """One status section (e.g. a recorded ``TrtllmRecord``), None when it is not a well-formed record."""
    parsed = record(cls, raw)
    return None if isinstance(parsed, _Invalid) else parsed


def to_wire(record: object) -> dict[str, Any]:
    """Any status model -> its camelCase dict (None fields left out, enumerations as plain strings)."""
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"{type(record).__name__} is not a status model")
    return _wire_record(record)


def _wire_record(record: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in _keys(type(record)):
        value = getattr(record, name)
        if value is not None:
            out[key] = _wire(value)
    return out


def _wire(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (str, int)):  # bool is an int
        return value
    if isinstance(value, tuple):
        return [_wire(v) for v in value]
    return _wire_record(value)


# The tables below are built once per model class: status is parsed and written on every reconcile pass.

_KEYS: dict[type, tuple[tuple[str, str], ...]] = {}
_FIELDS: dict[type, tuple[tuple[str, str, Parser, bool], ...]] = {}


def _keys(cls: type) -> tuple[tuple[str, str], ...]:
    """(field name, camelCase key) of a model class."""
    if cls not in _KEYS:
        _KEYS[cls] = tuple((f.name, camel(f.name)) for f in dataclasses.fields(cls))
    return _KEYS[cls]


def _fields(cls: type) -> tuple[tuple[str, str, Parser, bool], ...]:
    """(field name, camelCase key, parser, required) of a model class."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = tuple(
            (f.name, camel(f.name), _parser(hints[f.name]),
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)
        )
    return _FIELDS[cls]


def record(cls: type[T], raw: object) -> T | _Invalid:
    """``raw`` as a ``cls``, or the invalid marker when it is not a well-formed one."""
    if not isinstance(raw, dict):
        return _INVALID
    kwargs: dict[str, Any] = {}
    for name, key, parse, required in _fields(cls):
        value = parse(raw[key]) if key in raw else _INVALID
        if not isinstance(value, _Invalid):
            kwargs[name] = value
        elif required:
            return _INVALID  # a required field (a condition's type, say) is missing or malformed
    return cls(**kwargs)


def _parser(tp: Any) -> Parser:
    """The parser of one field type; an unknown type is a programming error (the parity test catches it)."""
    if (inner := optional_of(tp)) is not None:
        parse_inner = _parser(inner)
        return lambda raw: None if raw is None else parse_inner(raw)
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = frozenset(typing.get_args(tp))
        return lambda raw: raw if isinstance(raw, str) and raw in allowed else _INVALID
    if origin is tuple:
        parse_item = _parser(typing.get_args(tp)[0])
        return lambda raw: tuple(v for v in map(parse_item, raw) if not isinstance(v, _Invalid)) \
            if isinstance(raw, list) else _INVALID
    if isinstance(tp, type) and issubclass(tp, Enum):
        members: dict[object, object] = {m.value: m for m in tp}
        return lambda raw: members.get(raw, _INVALID) if isinstance(raw, str) else _INVALID
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        model = tp
        return lambda raw: record(model, raw)
    if tp is bool:
        return lambda raw: raw if isinstance(raw, bool) else _INVALID
    if tp is int:
        return lambda raw: raw if isinstance(raw, int) and not isinstance(raw, bool) else _INVALID
    if tp is str:
        return lambda raw: raw if isinstance(raw, str) else _INVALID
    raise TypeError(f"status models use no {tp!r}")
