"""Which existing objects an engine may write: the ownership rule of the write layer (issue 22).

The name an engine renders a child under can be taken: an administrator's Service called like the engine, a
ConfigMap a tenant chose the engine's name to reach. kvpilot writes an object only when it does not exist, or
when it is the engine's own, judged by what the rendered object says of itself, for every kind alike (a
LeaderWorkerSet rendered with a controller reference needs no rule of its own):

- **A child the engine controls** (rendered with a controller reference to it: Deployment, Service, ConfigMap,
  PodDisruptionBudget, ...) may be written only while the live object's controller reference is this engine's
  UID. An engine deleted and re-created under the same name has another UID: its predecessor's children, until
  the garbage collector removes them, are not adopted either.
- **A shared object** (rendered without a controller: a build Job several engines own, an engine-index entry, a
  cache claim the operator created) may be written only while the live object is owned by InferenceEngines
  alone (or by nothing), and carries the labels that make it kvpilot's of that role: ``managed-by``, its
  component, and the claim and fingerprint it stands for when it has them. Never by name alone. (A claim an
  earlier kvpilot created still has its creating engine as controller: still kvpilot's, and the next apply
  drops that reference: docs/engine-cache.md.)

Anything else is someone else's: ``refusal`` says whose, and the write layer reports it (``NameConflict``)
instead of writing.
"""

from __future__ import annotations

from typing import Any

from kvpilot import API_VERSION, KIND
from kvpilot.desired import labels as L

ENGINE_GROUP = API_VERSION.split("/")[0]
# The labels that say what a shared object stands for; compared only where the rendered object sets them.
IDENTITY_LABELS = (*L.MANAGED_BY, L.COMPONENT_LABEL, "serving.kvpilot.io/claim", L.FINGERPRINT_LABEL)


def _refs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r for r in refs if isinstance(r, dict)]


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The object's controller reference (at most one: the API server enforces it), None without one."""
    return next((r for r in _refs(obj) if r.get("controller") is True), None)


def is_engine_ref(ref: dict[str, Any]) -> bool:
    """A reference to an InferenceEngine (any version of kvpilot's API group)."""
    return ref.get("kind") == KIND and str(ref.get("apiVersion", "")).split("/")[0] == ENGINE_GROUP


def controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether the object's controller is the InferenceEngine of this UID."""
    ref = controller_of(obj)
    return bool(uid) and ref is not None and is_engine_ref(ref) and ref.get("uid") == uid


def _holder(ref: dict[str, Any] | None) -> str:
    if ref is None:
        return "is controlled by nothing kvpilot made"
    if is_engine_ref(ref):
        return (f"is controlled by InferenceEngine {ref.get('name')} of another UID ({ref.get('uid')}: one deleted, "
                f"or another), not by this one")
    return f"is controlled by {ref.get('kind')} {ref.get('name')}"


def refusal(desired: dict[str, Any], live: dict[str, Any], owner_uid: str) -> str | None:
    """Why the engine of ``owner_uid`` may not write ``desired`` over ``live`` (the object of that name that
    exists), or None when it may. The words complete "<Kind> <ns>/<name> exists and ..."."""
    if controller_of(desired) is not None:
        return None if controlled_by(live, owner_uid) else _holder(controller_of(live))
    others = [r for r in _refs(live) if not is_engine_ref(r)]
    if others:
        return f"is owned by {others[0].get('kind')} {others[0].get('name')}, not by InferenceEngines alone"
    want = (desired.get("metadata") or {}).get("labels") or {}
    have = (live.get("metadata") or {}).get("labels") or {}
    missing = [key for key in IDENTITY_LABELS if key in want and have.get(key) != want[key]]
    if missing:
        return f"was not made by kvpilot for this role (label {missing[0]} is not {want[missing[0]]!r})"
    return None
