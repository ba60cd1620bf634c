"""List-then-watch of one child kind into the watch cache: a small informer, as client-go's.

Why not kopf's own watches: kopf runs every event of every object through a per-object worker (memories,
batching window, handler bookkeeping). Measured at 1,000 engines, re-listing ~5,000 children after a restart
went at ~25 objects a second on a loaded 2-core machine, so the cache took minutes to fill. Here a list page
is one JSON parse and a watch event one line: the cache is filled in seconds.

Each informer runs in a thread of its own (a watch is a long, blocking read) and hands what it reads to the
event loop with ``call_soon_threadsafe``. A list is delivered as a whole (``replace``) so objects deleted
while nobody watched leave the cache too.

Staying connected (issue 22):

- Each watch asks the server to end it after ``WATCH_TIMEOUT_S`` and to send bookmarks. The server sends one
  about two seconds before that deadline (k8s.io/apiserver cacher ``nextBookmarkTime``), so a healthy stream
  never stays silent longer than the timeout; a stream silent for ``READ_IDLE_S`` is half-open (a dead peer, a
  dropped NAT entry) and is replaced, within a minute.
- A watch the server ended is resumed from the last resourceVersion seen (bookmarks keep it current), not
  re-listed: a list happens at start and after 410 Gone only, so the short timeout costs one cheap request
  per kind and minute, not a re-list of every child.
- Failures back off (``ReconnectBackoff``): briefly while the server does not answer at all (a refused
  connection costs it nothing, and the watches should be back as soon as it is), longer while it answers with
  errors; the back-off starts over once the server answers, and ends with its first success.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from kvpilot.k8s.cache import ChildKind, slim

log = logging.getLogger(__name__)
PAGE = 500
# The server ends each watch after this; it sends a bookmark ~2 s before (when the request allows bookmarks).
WATCH_TIMEOUT_S = 45
# Longer than any silence of a healthy stream (at most WATCH_TIMEOUT_S), and under a minute: a half-open stream
# is noticed and replaced within a minute of its last byte.
READ_IDLE_S = WATCH_TIMEOUT_S + 10
CONNECT_TIMEOUT_S = 10
LIST_READ_TIMEOUT_S = 120
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=kvpilot"
ABSENT_RECHECK_SECONDS = 60.0  # how often a kind whose API is not served (a missing CRD) is listed again

# (kind, items) after a list; (kind, event type, object) for a watch event.
OnList = Callable[[str, list[dict[str, Any]]], None]
OnEvent = Callable[[str, str, dict[str, Any]], None]


class ServerRefused(Exception):
    """The API server answered a list or watch with an HTTP error status (it is up, but said no)."""

    def __init__(self, path: str, status: int, body: bytes, retry_after_s: float | None = None,
                 relist: bool = False):
        super().__init__(f"GET {path}: HTTP {status}: {body[:300]!r}")
        self.status = status
        self.retry_after_s = retry_after_s
        self.relist = relist  # an error event inside a watch: the next attempt lists again


def server_answered(exc: BaseException) -> bool:
    """Whether a failure came with an answer from the server. A refused or reset connection, a timeout or a TLS
    failure is no answer (the kubernetes client reports TLS failures as ApiException with status 0)."""
    if isinstance(exc, (Urllib3Error, OSError)):
        return False
    return not (isinstance(exc, ApiException) and not exc.status)


@dataclass
class ReconnectBackoff:
    """How long an informer waits before its next attempt, from the failures since its last success.

    While the server does not answer, attempts come every ``unreachable_cap_s`` at most: a refused connection
    costs the server nothing, and a watch should be back within seconds of the server. Once the server answers,
    the back-off starts over from ``base_s`` (the server is back, perhaps still starting), and grows to
    ``answered_cap_s`` while it keeps answering with errors (403, 429, 5xx), so an operator that cannot succeed
    does not hammer it; a Retry-After the server sends is honoured. A success ends the back-off.
    ``rng`` (0 <= x < 1) spreads the informers' retries by +-``jitter``; tests pass a fixed one.
    """

    base_s: float = 0.5
    unreachable_cap_s: float = 4.0
    answered_cap_s: float = 30.0
    jitter: float = 0.2
    rng: Callable[[], float] = field(default=random.random)
    failures: int = 0
    unreachable: bool = False  # the last failure had no answer from the server

    def succeeded(self) -> bool:
        """The server answered with success; True when that ended a run of failures."""
        recovered = self.failures > 0
        self.failures, self.unreachable = 0, False
        return recovered

    def failed(self, exc: BaseException) -> float:
        """Count a failure; the seconds to wait before the next attempt."""
        answered = server_answered(exc)
        if answered and self.unreachable:
            self.failures = 0  # the server answers again: start over, it may be ready in a moment
        self.unreachable = not answered
        self.failures += 1
        cap = self.answered_cap_s if answered else self.unreachable_cap_s
        delay = min(cap, self.base_s * 2.0 ** min(self.failures - 1, 16))
        retry_after = exc.retry_after_s if isinstance(exc, ServerRefused) else None
        if retry_after is not None:
            return min(self.answered_cap_s, max(delay, retry_after))
        return delay * (1 + self.jitter * (2 * self.rng() - 1))


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class Informer:
    def __init__(self, api_client: k8s_client.ApiClient, kind: ChildKind, namespace: str | None,
                 loop: asyncio.AbstractEventLoop, on_list: OnList, on_event: OnEvent, *,
                 backoff: ReconnectBackoff | None = None, sleep: Callable[[float], object] | None = None):
        """``sleep`` waits between attempts; by default on ``stopped``, so ``stop()`` ends the wait at once."""
        self.api_client, self.kind, self.namespace = api_client, kind, namespace
        self.loop, self.on_list, self.on_event = loop, on_list, on_event
        self.stopped = threading.Event()
        self.backoff = backoff or ReconnectBackoff()
        self.sleep: Callable[[float], object] = sleep or self.stopped.wait
        self.rv = ""  # the last resourceVersion seen; empty: list first
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
        if resp.status == 410:
            raise _Relist(f"GET {self.path}: HTTP 410 Gone")
        if resp.status != 200:
            raise ServerRefused(self.path, resp.status, resp.read() or b"", _retry_after(resp.getheaders()))
        return resp.response

    def _list(self) -> str:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            resp = self._get([("limit", PAGE), *([("continue", cont)] if cont else [])],
                             (CONNECT_TIMEOUT_S, LIST_READ_TIMEOUT_S))
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

    def _watch(self) -> None:
        """Deliver the events after ``self.rv`` until the server ends the watch, advancing ``self.rv`` with each
        event and bookmark: the next watch resumes from there, also after a stream that broke."""
        resp = self._get([("watch", "true"), ("resourceVersion", self.rv), ("allowWatchBookmarks", "true"),
                          ("timeoutSeconds", WATCH_TIMEOUT_S)], (CONNECT_TIMEOUT_S, READ_IDLE_S))
        self._connected()
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                if self.stopped.is_set():
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._deliver(json.loads(line))
        finally:
            resp.release_conn()

    def _deliver(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # a Status: 410 Gone (the resourceVersion is too old) lists again at once
            code = int(obj["code"]) if isinstance(obj.get("code"), int) else 0
            if code == 410:
                raise _Relist(str(obj.get("message", obj)))
            raise ServerRefused(self.path, code, str(obj.get("message", obj)).encode(), relist=True)
        self.rv = str((obj.get("metadata") or {}).get("resourceVersion") or self.rv)
        if kind != "BOOKMARK":
            # Slimmed here, before the hand-over: during a burst (1,000 engines rolling out) events wait for the
            # event loop, and whole objects (managedFields, pod specs) waiting in that queue were the operator's
            # peak memory.
            slimmed = slim(self.kind.kind, obj, keep_spec=self.kind.keep_spec)
            self.loop.call_soon_threadsafe(self.on_event, self.kind.kind, str(kind), slimmed)

    def _connected(self) -> None:
        if self.backoff.succeeded():
            log.info("Watch of %s is back", self.kind.plural)

    def _run(self) -> None:
        absent = False
        while not self.stopped.is_set():
            try:
                if not self.rv:
                    self.rv = self._list()
                    self._connected()
                absent = False
                self._watch()  # the server ended it (timeout): resume from the last resourceVersion
            except _Relist:
                self.rv = ""
            except _Absent as exc:
                # Listed as empty, so the cache syncs and engines of the other kinds reconcile; a multi-node engine
                # then has no LeaderWorkerSet to observe. Listed again later, in case the CRD gets installed.
                if not absent:
                    log.warning("%s are not served (%s): treated as none; checking again every %.0fs",
                                self.kind.plural, exc, ABSENT_RECHECK_SECONDS)
                    self.loop.call_soon_threadsafe(self.on_list, self.kind.kind, [])
                absent = True
                self.rv = ""
                self.stopped.wait(ABSENT_RECHECK_SECONDS)
            except Exception as exc:  # noqa: BLE001 — a watch must outlive any one failure
                if isinstance(exc, ServerRefused) and exc.relist:
                    self.rv = ""
                delay = self.backoff.failed(exc)
                n = self.backoff.failures
                # Retries come every few seconds while the server is away: log the 1st, 2nd, 4th, 8th... only.
                log.log(logging.WARNING if n & (n - 1) == 0 else logging.DEBUG,
                        "Watch of %s failed (failure %d, retry in %.1fs): %s", self.kind.plural, n, delay, exc)
                self.sleep(delay)


class _Relist(Exception):
    pass


class _Absent(Exception):
    pass
