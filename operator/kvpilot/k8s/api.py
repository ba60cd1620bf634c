"""The one boundary to the API server: server-side apply, reads, creates, status patches, events.

Everything goes through the official Python client's DynamicClient (one field manager, ``kvpilot``).
Client exceptions are converted once, here (``errors.py``); nothing above this module sees an
``ApiException``. Calls are synchronous and run in a thread so the kopf event loop never blocks.
"""

from __future__ import annotations

import asyncio
import functools
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient

from kvpilot import API_VERSION, KIND
from kvpilot.k8s.errors import NotFound, convert

FIELD_MANAGER = "kvpilot"
T = TypeVar("T")


def load_client_config() -> k8s_client.ApiClient:
    """In-cluster config in a pod, else the current kubeconfig (``kvpilot run`` on a laptop)."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s_client.ApiClient()


class Api:
    """Typed-enough access to the handful of kinds kvpilot reads and writes."""

    def __init__(self, api_client: k8s_client.ApiClient | None = None):
        self._api_client = api_client or load_client_config()
        self._dyn: DynamicClient | None = None

    @property
    def dyn(self) -> DynamicClient:
        if self._dyn is None:  # discovery is slow: do it once, lazily
            self._dyn = DynamicClient(self._api_client)
        return self._dyn

    def _resource(self, api_version: str, kind: str) -> Any:
        """Discovery (cached after the first call); called inside ``_run``'s thread, never on the loop."""
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 — converted to domain errors in one place
            raise convert(exc) from exc

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under kvpilot's field manager; conflicts are forced (we own these objects)."""
        out = await self._run(
            lambda: self.dyn.server_side_apply(
                self._resource(obj["apiVersion"], obj["kind"]), body=obj, namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER, force_conflicts=True,
            )
        )
        return out.to_dict()  # type: ignore[no-any-return]

    async def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            out = await self._run(lambda: self._resource(api_version, kind).get(name=name, namespace=namespace))
        except NotFound:
            return None
        return out.to_dict()  # type: ignore[no-any-return]

    async def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = await self._run(
            lambda: self._resource(api_version, kind).get(namespace=namespace, label_selector=selector))
        return [item.to_dict() for item in out.items]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = await self._run(
            lambda: self._resource(obj["apiVersion"], obj["kind"]).create(
                body=obj, namespace=obj["metadata"].get("namespace")))
        return out.to_dict()  # type: ignore[no-any-return]

    async def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        def call() -> Any:
            res = self._resource(api_version, kind)
            if subresource:
                res = res.subresources[subresource]
            return res.patch(body=patch, name=name, namespace=namespace, content_type="application/merge-patch+json")

        out = await self._run(call)
        return out.to_dict()  # type: ignore[no-any-return]

    async def strategic_patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        out = await self._run(
            lambda: self._resource(api_version, kind).patch(
                body=patch, name=name, namespace=namespace, content_type="application/strategic-merge-patch+json"))
        return out.to_dict()  # type: ignore[no-any-return]

    async def patch_engine_status(self, name: str, namespace: str, status: dict[str, Any]) -> None:
        """The operator's only write to an InferenceEngine: its status subresource (never spec)."""
        await self.merge_patch(API_VERSION, KIND, name, namespace, {"status": status}, subresource="status")

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event on the InferenceEngine (what `kubectl describe ie` shows)."""
        now = datetime.now(timezone.utc)
        meta = involved["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "kvpilot"},
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
            "reportingComponent": "kvpilot",
            "reportingInstance": "kvpilot",
        }
        await self.create(event)
