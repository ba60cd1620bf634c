"""An in-memory cache of kvpilot's children, fed by the operator's own informers (``k8s/informer.py``).

Why: a reconcile that GETs its Job, Deployment, ConfigMap and claim and LISTs its pods costs about seven API
calls per engine per pass, every pass, while nothing changes (docs/scale.md). Controller-runtime operators read
from an informer cache instead, and so does kvpilot: every list and watch event of a child kind lands here
(``replace``/``upsert``/``delete``, by ``k8s/watches.py``), and the reconcile reads from here.

The cache is complete before the first reconcile: every engine's loop waits until each child kind has been
listed once (``ChildWatches.synced``).

Objects are stored slimmed (``slim``): no ``managedFields`` (often half an object), and for pods and Jobs only
metadata and status, because nothing kvpilot decides reads their spec. Deployments, Services and ConfigMaps
keep what kvpilot applies, so ``drift.owned_fields_differ`` can see an out-of-band edit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

ENGINE_LABEL = "serving.kvpilot.io/engine"
CLAIM_LABEL = "serving.kvpilot.io/claim"
FINGERPRINT_LABEL = "serving.kvpilot.io/fingerprint"
COMPONENT_LABEL = "app.kubernetes.io/component"
INDEX_COMPONENT = "engine-index"


@dataclass(frozen=True)
class ChildKind:
    """A kind the operator watches and caches; adding a child kind (a PodDisruptionBudget) is one entry."""

    api_version: str
    kind: str
    plural: str
    keep_spec: bool  # kvpilot applies it: keep the spec to detect out-of-band edits
    managed_only: bool = True  # watch only objects labelled managed-by=kvpilot (a user's claim is not)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("batch/v1", "Job", "jobs", keep_spec=False),
    ChildKind("apps/v1", "Deployment", "deployments", keep_spec=True),
    # The serving Deployment's ReplicaSets (labelled as its pod template is): a pod counts as the engine's only
    # through them (observe/lineage.py). Kept as metadata and status: owners and the revision annotation.
    ChildKind("apps/v1", "ReplicaSet", "replicasets", keep_spec=False),
    ChildKind("v1", "Pod", "pods", keep_spec=False),
    ChildKind("v1", "Service", "services", keep_spec=True),
    ChildKind("v1", "ConfigMap", "configmaps", keep_spec=True),
    ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", keep_spec=True),
    # Multi-node engines (desired/multinode.py). Where the LWS CRD is not installed its watch lists as empty
    # (k8s/informer.py), so the cache still syncs.
    ChildKind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", keep_spec=True),
    # Claims named by the user carry no kvpilot label: watch them all (a namespace holds few).
    ChildKind("v1", "PersistentVolumeClaim", "persistentvolumeclaims", keep_spec=True, managed_only=False),
)
KIND_BY_NAME = {k.kind: k for k in CHILD_KINDS}
_DROP_META = ("managedFields", "selfLink")


def slim(kind: str, body: dict[str, Any], *, keep_spec: bool | None = None) -> dict[str, Any]:
    """What the cache keeps of one object: the fields a decision or a drift check reads. ``keep_spec`` is the
    watching informer's own choice (a GPU-capacity watch of every pod needs ``spec.nodeName`` and the requests,
    which the child cache's pods do not); None: the child kind's."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in _DROP_META}
    out: dict[str, Any] = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": meta}
    if keep_spec is None:
        spec_kind = KIND_BY_NAME.get(kind)
        keep_spec = spec_kind is not None and spec_kind.keep_spec
    for key, value in body.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        if key == "status" or keep_spec:
            out[key] = value
    if kind == "Deployment":  # the status is rewritten often; only what deployment_state reads matters
        out["status"] = {k: v for k, v in (body.get("status") or {}).items()
                         if k not in ("collisionCount",)}
    return out


def _fingerprint(obj: dict[str, Any]) -> Any:
    """What a change means for the decisions: everything but the bookkeeping the server bumps."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion",)}
    return {**obj, "metadata": meta}


def owners_of(obj: dict[str, Any]) -> set[str]:
    """The InferenceEngines an object concerns: owner references (a shared Job has several) and the engine
    label (pods are owned by ReplicaSets, not by the engine)."""
    meta = obj.get("metadata") or {}
    names = {r.get("name", "") for r in meta.get("ownerReferences") or [] if r.get("kind") == "InferenceEngine"}
    names.add((meta.get("labels") or {}).get(ENGINE_LABEL, ""))
    return names - {""}


class ChildCache:
    """Children by (kind, namespace, name), with secondary indexes by owner engine, build Job and claim."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._by_engine: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (kind, ns, engine) -> names
        self._pods_by_job: dict[tuple[str, str], set[str]] = defaultdict(set)  # (ns, job) -> pod names
        self._index_by_claim: dict[tuple[str, str], set[str]] = defaultdict(set)  # (ns, claim) -> CM names
        self._by_uid: dict[str, tuple[str, str, str]] = {}  # uid -> (kind, ns, name): owner chains by UID
        self._counts: dict[str, int] = defaultdict(int)

    def __len__(self) -> int:
        return len(self._objects)

    def count(self, kind: str) -> int:
        """Objects cached of one kind (the operator's metrics report them: the cache's memory footprint)."""
        return self._counts.get(kind, 0)

    def upsert(self, kind: str, body: dict[str, Any]) -> bool:
        """Store the object; True when something other than server bookkeeping changed (worth a wake-up)."""
        obj = slim(kind, body)
        meta = obj["metadata"]
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        old = self._objects.get(key)
        if old is not None and _older(meta.get("resourceVersion"), old["metadata"].get("resourceVersion")):
            return False  # a late event (e.g. the initial listing after a watch event): keep the newer one
        if old is not None:
            self._unindex(key, old)
        else:
            self._counts[kind] += 1
        self._objects[key] = obj
        self._index(key, obj)
        return old is None or _fingerprint(old) != _fingerprint(obj)

    def delete(self, kind: str, body: dict[str, Any]) -> bool:
        meta = body.get("metadata") or {}
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
            self._counts[kind] -= 1
        return old is not None

    def replace(self, kind: str, items: list[dict[str, Any]], namespace: str | None = None) -> list[dict[str, Any]]:
        """A fresh list of ``kind`` (in ``namespace``, or everywhere): store every item and drop what is no
        longer there (deleted while no watch was open). Returns the objects that changed, to wake owners."""
        changed, seen = [], set()
        for item in items:
            meta = item.get("metadata") or {}
            seen.add((meta.get("namespace", ""), meta.get("name", "")))
            if self.upsert(kind, item):
                changed.append(item)
        gone = [key for key in self._objects
                if key[0] == kind and (namespace is None or key[1] == namespace) and key[1:] not in seen]
        for key in gone:
            old = self._objects[key]
            self.delete(kind, old)
            changed.append(old)
        return changed

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((kind, namespace, name))

    def by_uid(self, uid: str) -> dict[str, Any] | None:
        """The cached object of this UID (an owner reference names its owner by UID), None when none is."""
        key = self._by_uid.get(uid)
        return self._objects.get(key) if key is not None else None

    def owned(self, kind: str, namespace: str, engine: str) -> list[dict[str, Any]]:
        names = self._by_engine.get((kind, namespace, engine), ())
        return [o for n in sorted(names) if (o := self._objects.get((kind, namespace, n))) is not None]

    def pods_of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        names = self._pods_by_job.get((namespace, job), ())
        return [o for n in sorted(names) if (o := self._objects.get(("Pod", namespace, n))) is not None]

    def index_entries(self, namespace: str, claim: str) -> list[dict[str, Any]]:
        """The engine-index ConfigMaps of one claim (one per fingerprint)."""
        names = self._index_by_claim.get((namespace, claim[:63]), ())  # label values stop at 63 characters
        return [o for n in sorted(names) if (o := self._objects.get(("ConfigMap", namespace, n))) is not None]

    def _secondary_keys(self, key: tuple[str, str, str], obj: dict[str, Any]) -> list[tuple[dict[Any, set[str]], Any]]:
        kind, ns, name = key
        labels = obj["metadata"].get("labels") or {}
        out: list[tuple[dict[Any, set[str]], Any]] = [(self._by_engine, (kind, ns, e)) for e in owners_of(obj)]
        if kind == "Pod" and labels.get("job-name"):
            out.append((self._pods_by_job, (ns, labels["job-name"])))
        if kind == "ConfigMap" and labels.get(COMPONENT_LABEL) == INDEX_COMPONENT and labels.get(CLAIM_LABEL):
            out.append((self._index_by_claim, (ns, labels[CLAIM_LABEL])))
        return out

    def _index(self, key: tuple[str, str, str], obj: dict[str, Any]) -> None:
        for table, skey in self._secondary_keys(key, obj):
            table[skey].add(key[2])
        uid = obj["metadata"].get("uid")
        if uid:
            self._by_uid[uid] = key

    def _unindex(self, key: tuple[str, str, str], obj: dict[str, Any]) -> None:
        uid = obj["metadata"].get("uid")
        if uid and self._by_uid.get(uid) == key:
            del self._by_uid[uid]
        for table, skey in self._secondary_keys(key, obj):
            names = table.get(skey)
            if names is not None:
                names.discard(key[2])
                if not names:
                    del table[skey]


def _older(new: str | None, old: str | None) -> bool:
    """resourceVersions are opaque, but etcd's are integers; compare them only when both are."""
    try:
        return int(new or "") < int(old or "")
    except ValueError:
        return False
