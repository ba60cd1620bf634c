"""Write only on a diff: does a child in the cache already hold what kvpilot would apply?

Two checks, both needed:
* the ``applied-hash`` annotation (a hash of the normalized desired object, written with it) changes when
  kvpilot's rendering changes, including a field it stops setting, which a projection cannot see;
* ``owned_fields_differ`` projects the live object onto the fields kvpilot sets and compares them, so an
  out-of-band edit (``kubectl edit``, ``kubectl scale``) of a field kvpilot owns is undone by the next pass,
  as server-side apply would. Fields the server or other controllers add (defaults, status) are ignored.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

APPLIED_HASH_ANNOTATION = "serving.kvpilot.io/applied-hash"


def applied_hash(obj: dict[str, Any]) -> str:
    """A stable hash of what kvpilot applies (the annotation itself excluded, key order irrelevant)."""
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_HASH_ANNOTATION}
    meta["annotations"] = annotations
    text = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_applied_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with its hash annotation set (what is sent to the server)."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH_ANNOTATION: applied_hash(obj)}
    return {**obj, "metadata": meta}


def _scalar(value: Any) -> str:
    # The server answers 1 for "1" in some places (quantities, intstr ports) and keeps strings elsewhere.
    return json.dumps(value) if isinstance(value, bool) else str(value)


def owned_fields_differ(desired: Any, live: Any, path: str = "") -> str | None:
    """The first path where ``live`` differs from ``desired`` on a field ``desired`` sets, or None.

    Empty maps and lists in ``desired`` match a missing field (the server drops them)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return (path or "/") if desired else None
        for key, value in desired.items():
            where = owned_fields_differ(value, live.get(key), f"{path}/{key}")
            if where is not None:
                return where
        return None
    if isinstance(desired, list):
        if live is None and not desired:
            return None
        if not isinstance(live, list) or len(live) != len(desired):
            return path
        for i, (d, v) in enumerate(zip(desired, live)):
            where = owned_fields_differ(d, v, f"{path}/{i}")
            if where is not None:
                return where
        return None
    if desired is None:
        return None
    return None if live is not None and _scalar(desired) == _scalar(live) else path


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> str | None:
    """Why ``desired`` must be applied over the cached ``live`` object, or None when it is already there."""
    if live is None:
        return "absent"
    if live["metadata"].get("deletionTimestamp"):
        return "being deleted"
    have = (live["metadata"].get("annotations") or {}).get(APPLIED_HASH_ANNOTATION)
    if have != applied_hash(desired):
        return "rendering changed"
    where = owned_fields_differ({k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}, live)
    return f"edited out of band at {where}" if where else None
