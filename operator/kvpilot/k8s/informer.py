"""List-then-watch of one child kind into the watch cache: a small informer, as client-go's.

Why not kopf's own watches: kopf runs every event of every object through a per-object worker (memories,
batching window, handler bookkeeping). Measured at 1,000 engines, re-listing ~5,000 children after a restart
went at ~25 objects a second on a loaded 2-core machine, so the cache took minutes to fill. Here a list page
is one JSON parse and a watch event one line: the cache is filled in seconds.

Each informer runs in a thread of its own (a watch is a long, blocking read) and hands what it reads to the
event loop with ``call_soon_threadsafe``. A list is delivered as a whole (``replace``) so objects deleted
while nobody watched leave the cache too; a watch that expires (410 Gone) or fails is followed by a new list.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, Callable

from kubernetes import client as k8s_client

from kvpilot.k8s.cache import ChildKind, slim

log = logging.getLogger(__name__)
PAGE = 500
WATCH_SECONDS = 300
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=kvpilot"
ABSENT_RECHECK_SECONDS = 60.0  # how often a kind whose API is not served (a missing CRD) is listed again

# (kind, items) after a list; (kind, event type, object) for a watch event.
OnList = Callable[[str, list[dict[str, Any]]], None]
OnEvent = Callable[[str, str, dict[str, Any]], None]


class Informer:
    def __init__(self, api_client: k8s_client.ApiClient, kind: ChildKind, namespace: str | None,
                 loop: asyncio.AbstractEventLoop, on_list: OnList, on_event: OnEvent):
        self.api_client, self.kind, self.namespace = api_client, kind, namespace
        self.loop, self.on_list, self.on_event = loop, on_list, on_event
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"kvpilot-watch-{kind.plural}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    @property
    def path(self) -> str:
        base = f"/api/{self.kind.version}" if not self.kind.group else f"/apis/{self.kind.api_version}"
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{base}{ns}/{self.kind.plural}"

    def _get(self, query: list[tuple[str, Any]], timeout: tuple[float, float]) -> Any:
        """A GET whose body is read by the caller (a watch is a stream): the raw urllib3 response."""
        if self.kind.managed_only:
            query = [*query, ("labelSelector", MANAGED_SELECTOR)]
        method, url, headers, _body, _post = self.api_client.param_serialize(
            "GET", self.path, query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        resp = self.api_client.call_api(method, url, header_params=headers, _request_timeout=timeout)
        if resp.status == 404:  # the kind's API is not served: its CRD (LeaderWorkerSet) is not installed
            raise _Absent(f"GET {self.path}: HTTP 404")
        if resp.status != 200:
            raise RuntimeError(f"GET {self.path}: HTTP {resp.status}: {resp.read()[:300]!r}")
        return resp.response

    def _list(self) -> str:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            resp = self._get([("limit", PAGE), *([("continue", cont)] if cont else [])], (10, 120))
            page = json.loads(resp.data)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", self.kind.api_version)
                item.setdefault("kind", self.kind.kind)
                items.append(slim(self.kind.kind, item, keep_spec=self.kind.keep_spec))
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
                break
        self.loop.call_soon_threadsafe(self.on_list, self.kind.kind, items)
        return rv

    def _watch(self, rv: str) -> None:
        resp = self._get([("watch", "true"), ("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                          ("timeoutSeconds", WATCH_SECONDS)], (10, WATCH_SECONDS + 30))
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                if self.stopped.is_set():
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # 410 Gone: the resourceVersion is too old; list again
                        raise _Relist(str(obj.get("message", obj)))
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind == "BOOKMARK":
                        continue
                    # Slimmed here, before the hand-over: during a burst (1,000 engines rolling out) events
                    # wait for the event loop, and whole objects (managedFields, pod specs) waiting in that
                    # queue were the operator's peak memory.
                    slimmed = slim(self.kind.kind, obj, keep_spec=self.kind.keep_spec)
                    self.loop.call_soon_threadsafe(self.on_event, self.kind.kind, kind, slimmed)
        finally:
            resp.release_conn()

    def _run(self) -> None:
        failures, absent = 0, False
        while not self.stopped.is_set():
            try:
                rv = self._list()
                failures, absent = 0, False
                while not self.stopped.is_set():
                    self._watch(rv)  # returns when the server ends the watch: list again (cheap, and exact)
                    rv = self._list()
            except _Relist:
                continue
            except _Absent as exc:
                # Listed as empty, so the cache syncs and engines of the other kinds reconcile; a multi-node engine
                # then has no LeaderWorkerSet to observe. Listed again later, in case the CRD gets installed.
                if not absent:
                    log.warning("%s are not served (%s): treated as none; checking again every %.0fs",
                                self.kind.plural, exc, ABSENT_RECHECK_SECONDS)
                    self.loop.call_soon_threadsafe(self.on_list, self.kind.kind, [])
                absent = True
                self.stopped.wait(ABSENT_RECHECK_SECONDS)
                continue
            except Exception as exc:  # noqa: BLE001 — a watch must outlive any one failure
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.warning("Watch of %s failed (retry in %.0fs): %s", self.kind.plural, delay, exc)
                time.sleep(delay)


class _Relist(Exception):
    pass


class _Absent(Exception):
    pass
