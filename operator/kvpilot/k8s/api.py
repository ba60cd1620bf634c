"""The one boundary to the API server: server-side apply, reads, creates, status patches, events.

What to write and when (only on a diff, create-or-join of shared Jobs, the write wait) is decided above it, in
the write layer (``k8s/writes.py``); this module is the wire.

Everything goes through the official Python client's DynamicClient (one field manager, ``kvpilot``).
Client exceptions are converted once, here (``errors.py``); nothing above this module sees an
``ApiException``. Calls are synchronous and run on a sized thread pool of the operator's own (not the
default executor, which has min(32, cpus + 4) threads shared with everything else), with an HTTP connection
pool of the same size, so the kopf event loop never blocks and a fleet's writes do not queue behind a handful
of threads (docs/scale.md).

Reads of children come from ``self.cache`` (fed by watches), not from here: see ``k8s/cache.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient

from kvpilot import API_VERSION, KIND, defaults, telemetry
from kvpilot.k8s.cache import ChildCache
from kvpilot.k8s.capacity import GpuCapacity
from kvpilot.k8s.events import EventRecorder
from kvpilot.k8s.errors import NotFound, convert

log = logging.getLogger(__name__)
FIELD_MANAGER = "kvpilot"
# The API server creates Services one at a time (it allocates each a ClusterIP), so a Service creation can wait
# far longer than any other write. Waiting in the shared pool, they held every thread and the status patches
# queued behind them; with more than a few in flight they only time out (HTTP 504). So Services get a small pool
# (a lane) of their own (the figures: docs/scale.md).
SERVICE_LANE = 8
T = TypeVar("T")


def load_client_config(pool_size: int = defaults.API_POOL_SIZE) -> k8s_client.ApiClient:
    """In-cluster config in a pod, else the current kubeconfig (``kvpilot run`` on a laptop)."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    conf = k8s_client.Configuration.get_default_copy()
    conf.connection_pool_maxsize = pool_size + SERVICE_LANE  # one connection per worker thread, kept alive
    return k8s_client.ApiClient(conf)


def _plain(answer: Any) -> dict[str, Any]:
    """The dynamic client's ResourceInstance as a plain dict (its to_dict() is unannotated)."""
    out: dict[str, Any] = answer.to_dict()
    return out


class Api:
    """Typed-enough access to the handful of kinds kvpilot reads and writes."""

    def __init__(self, api_client: k8s_client.ApiClient | None = None, pool_size: int = defaults.API_POOL_SIZE):
        self._api_client = api_client or load_client_config(pool_size)
        self.api_client = self._api_client  # the informers read through the same client (auth, TLS)
        self._dyn: DynamicClient | None = None
        self._dyn_lock = threading.Lock()
        self._resources: dict[tuple[str, str], Any] = {}
        self._pool = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="kvpilot-api")
        self.cache = ChildCache()
        self.gpus = GpuCapacity()  # fed by the Node and bound-pod informers (k8s/watches.py, ChildWatches.start_gpu)
        self.events = EventRecorder(self)
        self._service_pool = ThreadPoolExecutor(max_workers=SERVICE_LANE, thread_name_prefix="kvpilot-api-svc")

    @property
    def dyn(self) -> DynamicClient:
        # Discovery is slow and several worker threads reach here at start: create the client exactly once.
        if self._dyn is None:
            with self._dyn_lock:
                if self._dyn is None:
                    self._dyn = DynamicClient(self._api_client)
        return self._dyn

    def _resource(self, api_version: str, kind: str) -> Any:
        """Discovery (cached after the first call); called inside ``_run``'s thread, never on the loop."""
        key = (api_version, kind)
        res = self._resources.get(key)
        if res is None:
            res = self._resources[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return res

    async def _run(self, fn: Callable[..., T], *args: Any, verb: str = "", resource: str = "") -> T:
        if verb:
            telemetry.API_REQUESTS.labels(verb, resource).inc()
        pool = self._service_pool if resource == "Service" else self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))
        except Exception as exc:  # noqa: BLE001 — converted to domain errors in one place
            raise convert(exc) from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._service_pool.shutdown(wait=False, cancel_futures=True)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under kvpilot's field manager, conflicts forced. Only for an object the write layer
        has found to be kvpilot's (``k8s/writes.py``): it sends the live object's ``metadata.uid`` in ``obj``, so
        an object deleted and re-created by someone else since it was read is refused, not overwritten."""
        out = await self._run(
            lambda: self.dyn.server_side_apply(
                self._resource(obj["apiVersion"], obj["kind"]), body=obj, namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER, force_conflicts=True,
            ), verb="apply", resource=obj["kind"],
        )
        return _plain(out)

    async def create_applied(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` as if server-side applied: a create, which fails (409) when any object of the name
        exists, so an object that is not kvpilot's is never touched; then the fields the create recorded under
        kvpilot's manager as an update are handed to its apply entry, as a first server-side apply would have
        recorded them. Without that, a field kvpilot's rendering later stops setting would stay forever, owned by
        the create (server-side apply removes only fields no other manager entry holds)."""
        created = await self._run(
            lambda: self._resource(obj["apiVersion"], obj["kind"]).create(
                body=obj, namespace=obj["metadata"].get("namespace"), field_manager=FIELD_MANAGER),
            verb="create", resource=obj["kind"])
        return await self.hand_over_to_apply(_plain(created))

    async def hand_over_to_apply(self, created: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the managedFields of an object kvpilot just created: its create entry becomes its apply
        entry (a JSON patch guarded by the object's UID, so it can only change the object just created)."""
        meta = created["metadata"]
        entries = [{**e, "operation": "Apply"} if e.get("manager") == FIELD_MANAGER else e
                   for e in meta.get("managedFields") or []]
        patch = [{"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                 {"op": "replace", "path": "/metadata/managedFields", "value": entries}]
        out = await self._run(
            lambda: self._resource(created["apiVersion"], created["kind"]).patch(
                body=patch, name=meta["name"], namespace=meta.get("namespace"),
                content_type="application/json-patch+json", field_manager=FIELD_MANAGER),
            verb="patch", resource=created["kind"])
        return _plain(out)

    async def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            out = await self._run(lambda: self._resource(api_version, kind).get(name=name, namespace=namespace),
                                  verb="get", resource=kind)
        except NotFound:
            return None
        return _plain(out)

    async def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = await self._run(
            lambda: self._resource(api_version, kind).get(namespace=namespace, label_selector=selector),
            verb="list", resource=kind)
        return [item.to_dict() for item in out.items]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = await self._run(
            lambda: self._resource(obj["apiVersion"], obj["kind"]).create(
                body=obj, namespace=obj["metadata"].get("namespace")), verb="create", resource=obj["kind"])
        return _plain(out)

    async def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        def call() -> Any:
            res = self._resource(api_version, kind)
            if subresource:
                res = res.subresources[subresource]
            return res.patch(body=patch, name=name, namespace=namespace, content_type="application/merge-patch+json")

        out = await self._run(call, verb="patch", resource=kind + (f"/{subresource}" if subresource else ""))
        return _plain(out)

    async def strategic_patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        out = await self._run(
            lambda: self._resource(api_version, kind).patch(
                body=patch, name=name, namespace=namespace, content_type="application/strategic-merge-patch+json"),
            verb="patch", resource=kind)
        return _plain(out)

    async def patch_engine_status(self, name: str, namespace: str, status: dict[str, Any]) -> None:
        """The operator's only write to an InferenceEngine: its status subresource (never spec)."""
        await self.merge_patch(API_VERSION, KIND, name, namespace, {"status": status}, subresource="status")

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event on the InferenceEngine (what `kubectl describe ie` shows); a repeat of the same
        event is counted on the existing one, as the Kubernetes event recorder does."""
        await self.events.record(involved, type_, reason, message)
