"""The write layer: every write a reconcile pass makes to an engine's children, and the state those writes share.

One ``ChildWriter`` per operator, built beside its ``Api`` and passed to every pass (tests build a fresh one),
owns what used to be process globals of reconcile.py:

- **Create-or-join of shared build Jobs.** Engines with the same build inputs on the same claim share one Job
  (``labels.build_job_name``). While one engine's create is in flight, the others wait for it and then join the
  Job as owners, instead of racing it into 409s and adopt patches (docs/scale.md).
- **Adoption.** An engine that finds its build Job made by another engine adds itself as a non-controller owner
  (a strategic-merge patch of ``ownerReferences``, which merges by uid): the Job lives while one owner does.
- **The write wait.** A pass sends its writes at once and waits ``wait_seconds`` for them. A write still in flight
  then completes in the background; it is not sent again while it is, and its failure is handed to the engine's
  next pass (``write_all``), which puts it in status.

Every child write of the operator goes through one of ``apply``, ``start_build`` and ``join_build``, and each of
them reads the object it would change through ``_existing`` (the watch cache), or ``_live`` (the API server,
after a create found the name taken), and both judge it by one rule (``k8s/ownership.py``): an object that
exists and is not this engine's (or, for a shared Job, index entry or claim, not kvpilot's of that role) is
never written; the write raises ``NameConflict`` naming it, which status and an Event report (issue 22).

Why a create first, rather than a read before the first write: the watch cache lists only objects labelled
``managed-by=kvpilot``, so a foreign object looks absent there. A create cannot change an object that exists
(the API server answers 409), with no window between a read and a write for an object to appear in; only then
is the object read, uncached, to say whose it is (or to find an own object the cache missed). Server-side apply
has no create-only form (a precondition on ``metadata.uid`` refuses a missing object too). Later applies of an
object the cache shows as the engine's carry its ``metadata.uid``: an object replaced since it was read is
refused by the API server rather than overwritten.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from typing import Any

from kvpilot import telemetry
from kvpilot.api.models import ObjectRef
from kvpilot.desired import labels as L
from kvpilot.desired.once import CreateOnce
from kvpilot.k8s.api import Api
from kvpilot.k8s.drift import needs_apply, with_applied_hash
from kvpilot.k8s.errors import ApiError, Conflict, Invalid, NameConflict, Transient
from kvpilot.k8s.ownership import refusal

log = logging.getLogger(__name__)
WRITE_WAIT_SECONDS = 0.5  # how long a pass waits for its writes before it moves on (docs/scale.md)

# One write of a pass: how status names it ("Kind name"), and the write, not yet awaited.
Write = tuple[str, Awaitable[None]]
# A write's key in the in-flight and late-failure tables: (namespace, "Kind name").
WriteKey = tuple[str, str]


def owner_uids(obj: dict[str, Any]) -> set[str]:
    """The uids of an object's owners."""
    return {str(r.get("uid")) for r in (obj.get("metadata") or {}).get("ownerReferences") or []}


def _discard_outcome(task: asyncio.Task[None]) -> None:
    """Read the outcome of a write whose pass was cancelled, so asyncio does not log it as "never retrieved" (a
    write into a namespace being deleted fails with 403 NamespaceTerminating, and that is expected)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("A write of a stopped engine loop failed: %s", task.exception())


def build_job_identity(namespace: str, name: str, fingerprint: str) -> dict[str, Any]:
    """What the ownership rule reads of a shared build Job an engine joins without rendering it (the one it
    observed): its name and the labels of kvpilot's build Job for ``fingerprint`` (desired/build_job.py)."""
    labels = {**L.MANAGED_BY, L.COMPONENT_LABEL: "build", L.FINGERPRINT_LABEL: fingerprint[:32]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace,
                                                                  "labels": labels}}


class ChildWriter:
    """The operator's writes to children, and the state they share across passes and engines."""

    def __init__(self, api: Api, wait_seconds: float = WRITE_WAIT_SECONDS) -> None:
        self.api = api
        self.wait_seconds = wait_seconds
        # Build Jobs being created right now, by (namespace, name): the engines sharing one join this create.
        self._creating: dict[tuple[str, str], asyncio.Future[None]] = {}
        # Objects created once and never read back (a multi-node engine's SSH Secret): (namespace, kind, name, owner
        # uid) of those created or found to exist by this operator process.
        self._created_once: set[tuple[str, str, str, str]] = set()
        # Writes still in flight after their pass moved on, and the failures they ended in.
        self._in_flight: dict[WriteKey, asyncio.Task[None]] = {}
        self._late_failures: dict[WriteKey, ApiError] = {}

    def _existing(self, owner: ObjectRef, desired: dict[str, Any]) -> dict[str, Any] | None:
        """The cached object ``desired`` would change, None when the cache has none (absent, not yet listed, or
        not labelled as kvpilot's); raises NameConflict when it is not the engine's to write."""
        meta = desired["metadata"]
        ns = meta.get("namespace", owner.namespace)
        return self._judged(owner, desired, self.api.cache.get(desired["kind"], ns, meta["name"]))

    async def _live(self, owner: ObjectRef, desired: dict[str, Any]) -> dict[str, Any] | None:
        """The object ``desired`` would change, read from the API server (a create found the name taken: the
        cache may not show it), judged by the same rule."""
        meta = desired["metadata"]
        live = await self.api.get(desired["apiVersion"], desired["kind"], meta["name"],
                                  meta.get("namespace", owner.namespace))
        return self._judged(owner, desired, live)

    @staticmethod
    def _judged(owner: ObjectRef, desired: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any] | None:
        if live is None:
            return None
        why = refusal(desired, live, owner.uid)
        if why is not None:
            meta = desired["metadata"]
            raise NameConflict(desired["kind"], meta.get("namespace", owner.namespace), meta["name"], why)
        return live

    async def apply(self, owner: ObjectRef, obj: dict[str, Any]) -> bool:
        """Write ``obj`` (rendered for ``owner``) only when the engine's object differs from it on what kvpilot
        owns, or is absent (then created: ``_create``); True when it was written. The response goes into the
        cache at once, so the next pass does not write again while the watch event is still on its way."""
        existing = self._existing(owner, obj)
        if existing is None:
            return await self._create(owner, obj)
        return await self._apply_over(obj, existing)

    async def _create(self, owner: ObjectRef, obj: dict[str, Any]) -> bool:
        try:
            self.api.cache.upsert(obj["kind"], await self.api.create_applied(with_applied_hash(obj)))
            return True
        except Conflict:  # the name is taken by an object the cache does not show
            live = await self._live(owner, obj)  # raises NameConflict when it is not the engine's
        if live is None:
            raise Transient(f"{obj['kind']} {obj['metadata']['name']} was deleted while it was being created")
        return await self._apply_over(obj, live)

    async def _apply_over(self, obj: dict[str, Any], existing: dict[str, Any]) -> bool:
        """Server-side apply over an object found to be the engine's, when it differs from ``obj``."""
        meta = obj["metadata"]
        why = needs_apply(obj, existing)
        if why is None:
            telemetry.APPLIES_SKIPPED.labels(obj["kind"]).inc()
            return False
        if why.startswith("edited"):
            log.info("Restoring %s %s/%s: %s", obj["kind"], meta.get("namespace"), meta["name"], why)
        body = with_applied_hash(obj)
        uid = existing["metadata"].get("uid")
        if uid:  # refused if the object was deleted and re-created (by anyone) since it was read
            body = {**body, "metadata": {**body["metadata"], "uid": uid}}
        try:
            out = await self.api.apply(body)
        except (Conflict, Invalid) as exc:
            if isinstance(exc, Invalid) and "metadata.uid" not in str(exc):
                raise
            self.api.cache.delete(obj["kind"], existing)  # replaced (or gone) since read: judge it afresh
            raise Transient(f"{obj['kind']} {meta['name']} was replaced since it was read; it is judged again "
                            f"on the next pass") from exc
        self.api.cache.upsert(obj["kind"], out)
        return True

    async def start_build(self, owner: ObjectRef, job: dict[str, Any]) -> bool:
        """Create the build Job, or join it as an owner if another engine with the same inputs created it first
        (or is creating it now); True when this call created it. A Job of that name that is not kvpilot's
        build Job of these inputs (``k8s/ownership.py``) is a NameConflict."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        if self._existing(owner, job) is not None:  # another engine created it since this pass observed
            await self.join_build(owner, job)
            return False
        pending = self._creating.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            await self.join_build(owner, job)
            return False
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creating[key] = done
        try:
            self.api.cache.upsert("Job", await self.api.create(job))
            return True
        except Conflict:  # created before this operator started, and not yet in its cache (or not kvpilot's)
            live = await self._live(owner, job)
            if live is not None:
                self.api.cache.upsert("Job", live)
            await self.join_build(owner, job)
            return False
        finally:
            done.set_result(None)
            del self._creating[key]

    async def join_build(self, owner: ObjectRef, job: dict[str, Any]) -> None:
        """Add ``owner`` to the owners of the shared build Job ``job`` (as rendered, or as observed: its name,
        namespace and labels); nothing to do when the cache shows it is one already."""
        existing = self._existing(owner, job)
        if existing is not None and owner.uid in owner_uids(existing):
            return
        name = job["metadata"]["name"]
        ref = L.owner_reference(owner, controller=False)
        # ownerReferences merge by uid under a strategic-merge patch: this adds one owner, keeps the others. The
        # UID, when known, refuses a Job re-created under the name since it was judged.
        meta: dict[str, Any] = {"ownerReferences": [ref]}
        if existing is not None and existing["metadata"].get("uid"):
            meta["uid"] = existing["metadata"]["uid"]
        out = await self.api.strategic_patch("batch/v1", "Job", name, owner.namespace, {"metadata": meta})
        self.api.cache.upsert("Job", out)

    async def create_once(self, owner: ObjectRef, once: CreateOnce) -> bool:
        """Create ``once``'s object unless this process already created it or found it there (409); True when
        created. Rendered only then (a fresh SSH key pair costs milliseconds: not every pass).

        For an object the operator must not read (a Secret: its RBAC is ``create`` only), so neither the watch
        cache nor a GET can say whether it exists: one create per engine and operator start answers it. The
        response is not cached (the cache holds no Secret)."""
        key = (once.namespace, once.kind, once.name, owner.uid)
        if key in self._created_once:
            return False
        try:
            await self.api.create(once.render())
            created = True
        except Conflict:
            created = False
        self._created_once.add(key)
        return created

    async def write_all(self, namespace: str, writes: list[Write]) -> list[tuple[str, ApiError]]:
        """Send a pass's writes at once; return the failures among those that ended within ``wait_seconds``, and
        those of this namespace's earlier writes of the same objects that ended in the background. A write of
        an object still in flight is not sent again."""
        failed: list[tuple[str, ApiError]] = []
        tasks: dict[str, asyncio.Task[None]] = {}
        for what, write in writes:
            key = (namespace, what)
            late = self._late_failures.pop(key, None)
            if late is not None:
                failed.append((what, late))
            running = self._in_flight.get(key)
            if running is not None and not running.done():
                if asyncio.iscoroutine(write):
                    write.close()  # not sent: the same object is still being written
                continue
            tasks[what] = asyncio.ensure_future(write)
        if tasks:
            try:
                await asyncio.wait(tasks.values(), timeout=self.wait_seconds)
            except asyncio.CancelledError:  # the engine's loop stopped (the engine or its namespace went away):
                for task in tasks.values():  # its writes still end; nobody is left to report their failures to
                    task.add_done_callback(_discard_outcome)
                raise
        for what, task in tasks.items():
            key = (namespace, what)
            if not task.done():
                self._track(key, task)
                continue
            exc = task.exception()
            if isinstance(exc, ApiError):  # say so in status (a rendering bug, an immutable field), then retry
                failed.append((what, exc))
            elif exc is not None:
                raise exc
        return failed

    def _track(self, key: WriteKey, task: asyncio.Task[None]) -> None:
        """Follow a write that outlives its pass: it is in flight until it ends, then ``_landed`` keeps its failure."""
        self._in_flight[key] = task
        task.add_done_callback(functools.partial(self._landed, key))

    def _landed(self, key: WriteKey, task: asyncio.Task[None]) -> None:
        """A write that outlived its pass ended: keep its failure for the engine's next pass."""
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, ApiError):
            self._late_failures[key] = exc
        elif exc is not None:
            log.error("Write of %s in namespace %s failed: %s", key[1], key[0], exc)
