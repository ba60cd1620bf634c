"""The local kubelet's only boundary to the API server.

Objects travel as plain dicts (the API's own JSON, camelCase keys), not the client's generated models:
the agent reads a handful of fields from them and writes status with a JSON merge patch, and dicts keep
that faithful to the wire format. The kubernetes client still does the config, TLS and auth.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("localkubelet.kube")


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): the caller must list again."""


def _lines(resp) -> Iterator[str]:
    """Split a streamed watch response into its newline-delimited JSON events."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8", "replace")


class Kube:
    """Pods, their status, and the objects pods reference, through one kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)

    @staticmethod
    def _json(resp) -> dict:
        """Decode a raw (not preloaded) response."""
        return json.loads(resp.data)

    def list_pods(self, label_selector: str) -> tuple[list[dict], str]:
        """All matching pods in every namespace, and the list's resourceVersion to watch from."""
        body = self._json(
            self.core.list_pod_for_all_namespaces(label_selector=label_selector, _preload_content=False)
        )
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def watch_pods(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]:
        """(event type, pod) pairs from resource_version on; raises WatchExpired on 410 Gone."""
        try:
            resp: Any = self.core.list_pod_for_all_namespaces(
                label_selector=label_selector,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=(10, timeout_s + 30),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc.reason)) from exc
            raise
        try:
            for line in _lines(resp):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(obj.get("message", "resourceVersion too old"))
                    raise RuntimeError(f"watch error: {obj}")
                yield event["type"], obj
        finally:
            resp.release_conn()

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        """A ConfigMap, Secret, PersistentVolumeClaim, PersistentVolume or Node; None if it does not exist."""
        calls = {
            "ConfigMap": lambda: self.core.read_namespaced_config_map(name, namespace, _preload_content=False),
            "Secret": lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False),
            "PersistentVolumeClaim": lambda: self.core.read_namespaced_persistent_volume_claim(
                name, namespace, _preload_content=False
            ),
            "PersistentVolume": lambda: self.core.read_persistent_volume(name, _preload_content=False),
            "Node": lambda: self.core.read_node(name, _preload_content=False),
        }
        try:
            return self._json(calls[kind]())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_pod_status(self, namespace: str, name: str, uid: str, status: dict) -> bool:
        """Merge-patch the pod's status (lists are replaced wholesale). False if the pod is gone.
        The uid precondition keeps a recreated pod of the same name from receiving a stale status."""
        try:
            self.core.patch_namespaced_pod_status(
                name,
                namespace,
                {"metadata": {"uid": uid}, "status": status},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Finish a deletion the way the kubelet does, after its containers stopped: grace period 0."""
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)),
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
