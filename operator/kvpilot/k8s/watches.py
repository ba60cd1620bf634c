"""The child watches and the wake-up rules: which engines a change of a child concerns.

``ChildWatches`` starts one informer (``k8s/informer.py``) per child kind and namespace, feeds what they list and
watch into the cache (``k8s/cache.py``), and wakes the engines a change concerns, so a pass runs on news rather
than on a timer:

- a child wakes its owners (a shared build Job has several, which all need its outcome);
- a cache claim wakes the engines of its namespace that use it, an engine-index entry those of them that want
  its engine (an engine not yet reconciled is woken anyway: it does not know its claim yet);
- only a change the cache saw wakes (not server bookkeeping), and a shared build Job gaining an owner wakes
  nobody: the joining engine recorded it already (docs/scale.md).

Nodes and the pods of every namespace feed ``api.gpus`` instead (free GPUs per node, for
``serving.rollout.strategy: Auto``). The engines are read from the scheduler's registry (``loop.EngineLoops``)
through ``WakeTarget``: this module wakes them and knows nothing else of the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kvpilot import telemetry
from kvpilot.k8s.api import Api
from kvpilot.k8s.cache import CHILD_KINDS, COMPONENT_LABEL, INDEX_COMPONENT, owners_of
from kvpilot.k8s.capacity import BOUND_POD_KIND, NODE_KIND
from kvpilot.k8s.informer import Informer

log = logging.getLogger(__name__)


class WakeTarget(Protocol):
    """What the wake-up rules read of an engine's loop."""

    @property
    def wake(self) -> asyncio.Event: ...  # set: reconcile soon

    @property
    def fingerprint(self) -> str: ...  # the engine it wants (its last plan's); "" before its first pass

    @property
    def claim(self) -> str | None: ...  # its cache claim; None before its first pass, or without a cache


def only_owners_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """A shared build Job gaining an owner (each engine of the fingerprint joins it) is news to nobody: the
    joining engine recorded it already. Its status, labels, annotations or deletion changing is news."""
    if old is None:
        return False
    meta_old, meta_new = old.get("metadata") or {}, new.get("metadata") or {}
    return (old.get("status") == new.get("status") and meta_old.get("labels") == meta_new.get("labels")
            and meta_old.get("annotations") == meta_new.get("annotations")
            and meta_old.get("deletionTimestamp") == meta_new.get("deletionTimestamp"))


class ChildWatches:
    """List and watch the children into ``api.cache``; wake the engines of ``targets`` that a change concerns."""

    def __init__(self, api: Api, targets: Mapping[tuple[str, str], WakeTarget]) -> None:
        self.api = api
        self.targets = targets  # (namespace, name) -> the engine's loop; the scheduler's registry, read only
        self.synced = asyncio.Event()  # every child kind listed once: the cache can answer
        self.synced.set()  # until the informers are started (tests feed the cache by hand)
        self._informers: list[Informer] = []
        self._unsynced: set[tuple[str, str | None]] = set()

    def start(self, namespaces: list[str]) -> None:
        """List and watch every child kind (in each namespace, or cluster-wide) into the cache."""
        loop = asyncio.get_running_loop()
        self.synced.clear()
        scopes: list[str | None] = [*namespaces] or [None]  # None: cluster-wide
        for kind in CHILD_KINDS:
            for ns in scopes:
                self._unsynced.add((kind.kind, ns))

                def on_list(kind_name: str, items: list[dict[str, Any]], ns: str | None = ns) -> None:
                    self.children_listed(kind_name, items, ns)

                inf = Informer(self.api.api_client, kind, ns, loop, on_list, self.child_event)
                self._informers.append(inf)
                inf.start()

    def start_gpu(self) -> None:
        """Watch Nodes and the pods of every namespace into ``api.gpus``: whether a surge pod finds a free GPU
        (``serving.rollout.strategy: Auto``). Not part of ``synced``: until listed, Auto does not surge; a
        denied watch (RBAC without nodes/pods at cluster scope) retries with back-off and Auto stays NoSurge."""
        loop = asyncio.get_running_loop()
        for kind in (NODE_KIND, BOUND_POD_KIND):
            inf = Informer(self.api.api_client, kind, None, loop, self.api.gpus.listed, self._gpu_event)
            self._informers.append(inf)
            inf.start()

    def stop(self) -> None:
        for inf in self._informers:
            inf.stop()

    def _gpu_event(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        self.api.gpus.event(kind, event_type, body)

    def children_listed(self, kind: str, items: list[dict[str, Any]], namespace: str | None) -> None:
        """A (re)list of one kind in one scope: the cache takes it whole, and whom a difference concerns wakes."""
        for body in self.api.cache.replace(kind, items, namespace):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))
        self._unsynced.discard((kind, namespace))
        if not self._unsynced and not self.synced.is_set():
            log.info("Watch cache filled: %s", {k.kind: self.api.cache.count(k.kind) for k in CHILD_KINDS})
            self.synced.set()

    def child_event(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.child_deleted(kind, body)
        else:
            self.child_changed(kind, body)

    def child_changed(self, kind: str, body: dict[str, Any]) -> None:
        """A watch listed or changed a child: cache it, and wake whom it concerns if it really changed."""
        meta = body.get("metadata") or {}
        old = self.api.cache.get(kind, meta.get("namespace", ""), meta.get("name", ""))
        if self.api.cache.upsert(kind, body) and not (kind == "Job" and only_owners_changed(old, body)):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))

    def child_deleted(self, kind: str, body: dict[str, Any]) -> None:
        """A child is gone (by hand, or by the garbage collector): the next pass of its owner restores it."""
        if self.api.cache.delete(kind, body):
            self._wake_for(kind, body)
        telemetry.CACHED_OBJECTS.labels(kind).set(self.api.cache.count(kind))

    def _wake_for(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if kind == "PersistentVolumeClaim":
            self.wake_claim_users(meta.get("namespace", ""), meta.get("name", ""))
        elif kind == "ConfigMap" and labels.get(COMPONENT_LABEL) == INDEX_COMPONENT:
            self.wake_claim_users(meta.get("namespace", ""), (body.get("data") or {}).get("claim", ""),
                                  (body.get("data") or {}).get("fingerprint", ""))
        else:
            self.wake_owners(body)

    def wake_owners(self, child: dict[str, Any]) -> None:
        """A child changed: wake the InferenceEngines it concerns (its owners; a shared build Job has several,
        which all need its outcome). The caller wakes only on a change the cache saw, not on bookkeeping."""
        meta = child.get("metadata") or {}
        for name in owners_of(child):
            target = self.targets.get((meta.get("namespace", ""), name))
            if target is not None:
                target.wake.set()

    def wake_claim_users(self, namespace: str, claim: str, fingerprint: str | None = None) -> None:
        """A cache claim or an engine-index entry changed: wake the engines of that namespace that use the
        claim (and, for an entry, want that engine); an engine not yet reconciled is woken anyway."""
        for (ns, _name), target in self.targets.items():
            if ns != namespace or (target.claim is not None and target.claim != claim):
                continue
            if fingerprint is None or not target.fingerprint or target.fingerprint == fingerprint:
                target.wake.set()
