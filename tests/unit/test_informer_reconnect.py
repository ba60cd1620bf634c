"""The informer's reconnect behaviour on a fake API client (issue 22, item 5): the back-off while the server is
away or refusing and its reset once the server answers, the server-side watch timeout and the read timeout that
replace a half-open stream within a minute, bookmarks that let a watch resume without a re-list, and 410 Gone.

The fake is the informer's only I/O boundary (``param_serialize``/``call_api`` of the generated client); the
informer's loop runs in the test's thread, its waits recorded instead of slept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError

from kvpilot.k8s.cache import KIND_BY_NAME
from kvpilot.k8s.informer import (
    READ_IDLE_S,
    WATCH_TIMEOUT_S,
    Informer,
    ReconnectBackoff,
    ServerRefused,
    server_answered,
)


def no_jitter() -> float:
    return 0.5  # rng() == 0.5: the jitter factor is exactly 1


class Stream:
    """A watch or list body: chunks (bytes) or an exception raised while reading (a stream that breaks)."""

    def __init__(self, status: int, chunks: list[Any] | None = None, data: bytes = b"", headers: Any = None):
        self.status, self.chunks, self.data, self.headers = status, chunks or [], data, headers or {}
        self.response = self
        self.released = False

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> Any:
        return self.headers

    def stream(self, _amt: int, decode_content: bool = True) -> Iterator[bytes]:
        for chunk in self.chunks:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def release_conn(self) -> None:
        self.released = True


def event(type_: str, name: str, rv: str) -> bytes:
    obj = {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}
    return json.dumps({"type": type_, "object": obj}).encode() + b"\n"


def page(rv: str, *names: str) -> Stream:
    items = [{"metadata": {"name": n, "namespace": "ns", "resourceVersion": rv}} for n in names]
    return Stream(200, data=json.dumps({"metadata": {"resourceVersion": rv}, "items": items}).encode())


class FakeApiClient:
    """Answers each GET with the next scripted reply (a Stream, or an exception raised as the request fails);
    stops the informer when the script runs out."""

    def __init__(self, script: list[Any]):
        self.script = list(script)
        self.requests: list[tuple[dict[str, str], tuple[float, float]]] = []
        self.informer: Informer | None = None

    def param_serialize(self, method: str, path: str, query_params: list[tuple[str, Any]], **_: Any) -> tuple:
        return method, f"{path}?{urlencode(query_params)}", {}, None, None

    def call_api(self, _method: str, url: str, header_params: Any, _request_timeout: tuple[float, float]) -> Any:
        query = dict(pair.split("=", 1) for pair in url.split("?", 1)[1].split("&"))
        self.requests.append((query, _request_timeout))
        if not self.script:
            assert self.informer is not None
            self.informer.stop()
            raise NewConnectionError(None, "script over")  # type: ignore[arg-type]
        reply = self.script.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


class DirectLoop:
    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        fn(*args)


def run(script: list[Any], backoff: ReconnectBackoff | None = None) -> tuple[FakeApiClient, list[float], list[Any]]:
    """Run one informer of ConfigMaps over the script; the client, the waits and what it delivered."""
    client = FakeApiClient(script)
    waits: list[float] = []
    delivered: list[Any] = []
    inf = Informer(client, KIND_BY_NAME["ConfigMap"], "ns", DirectLoop(),  # type: ignore[arg-type]
                   on_list=lambda kind, items: delivered.append(("list", [i["metadata"]["name"] for i in items])),
                   on_event=lambda kind, type_, obj: delivered.append((type_, obj["metadata"]["name"])),
                   backoff=backoff or ReconnectBackoff(rng=no_jitter), sleep=waits.append)
    client.informer = inf
    inf._run()
    return client, waits, delivered


def refused() -> NewConnectionError:
    return NewConnectionError(None, "Connection refused")  # type: ignore[arg-type]


def test_failures_are_classified_by_whether_the_server_answered() -> None:
    assert not server_answered(refused())
    assert not server_answered(ProtocolError("Connection broken"))
    assert not server_answered(ApiException(status=0, reason="SSLError"))
    assert not server_answered(ConnectionResetError())
    assert server_answered(ServerRefused("/api/v1/configmaps", 503, b"not ready"))
    assert server_answered(ValueError("a body that is not JSON"))


def test_an_unreachable_server_is_retried_every_few_seconds_and_an_answer_starts_the_backoff_over() -> None:
    backoff = ReconnectBackoff(rng=no_jitter)
    unreachable = [backoff.failed(refused()) for _ in range(8)]
    assert unreachable == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]  # capped low: back within ~4 s of the server
    # The server is back but not ready (503): the back-off starts over from the base, then grows to 30 s.
    answered = [backoff.failed(ServerRefused("/p", 503, b"")) for _ in range(8)]
    assert answered == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.succeeded() is True and backoff.failures == 0
    assert backoff.failed(ServerRefused("/p", 403, b"")) == 0.5
    assert backoff.succeeded() is True and backoff.succeeded() is False


def test_retry_after_is_honoured_up_to_the_cap_and_jitter_spreads_retries() -> None:
    backoff = ReconnectBackoff(rng=no_jitter)
    assert backoff.failed(ServerRefused("/p", 429, b"", retry_after_s=7)) == 7
    assert backoff.failed(ServerRefused("/p", 429, b"", retry_after_s=600)) == 30
    low, high = ReconnectBackoff(rng=lambda: 0.0), ReconnectBackoff(rng=lambda: 0.999999)
    assert low.failed(refused()) == pytest.approx(0.4) and high.failed(refused()) == pytest.approx(0.6)


def test_every_watch_asks_for_a_server_timeout_and_bookmarks_and_reads_with_an_idle_limit_under_a_minute() -> None:
    client, _waits, _delivered = run([page("5", "a"), Stream(200, [event("BOOKMARK", "", "9")])])
    list_query, list_timeout = client.requests[0]
    watch_query, (connect_s, read_idle_s) = client.requests[1]
    assert "watch" not in list_query and list_query["labelSelector"] == "app.kubernetes.io%2Fmanaged-by%3Dkvpilot"
    assert watch_query["watch"] == "true" and watch_query["allowWatchBookmarks"] == "true"
    assert watch_query["resourceVersion"] == "5"
    assert int(watch_query["timeoutSeconds"]) == WATCH_TIMEOUT_S
    # A healthy stream is never silent longer than the server's timeout; a half-open one is given up on within
    # a minute of its last byte.
    assert WATCH_TIMEOUT_S < read_idle_s == READ_IDLE_S <= 60 and connect_s <= 10


def test_a_watch_the_server_ends_resumes_from_the_last_bookmark_without_a_relist() -> None:
    client, waits, delivered = run([
        page("5", "a"),
        Stream(200, [event("ADDED", "b", "6"), event("BOOKMARK", "", "40")]),  # ends at the server's timeout
        Stream(200, [event("MODIFIED", "b", "41")]),
    ])
    assert [q.get("resourceVersion") for q, _ in client.requests] == [None, "5", "40", "41"]
    assert sum("watch" not in q for q, _ in client.requests) == 1  # listed once, at start
    assert delivered[:3] == [("list", ["a"]), ("ADDED", "b"), ("MODIFIED", "b")]  # no event for the bookmark
    assert waits[:1] == [0.5]  # only the script's end (a refused connection) waited


def test_a_half_open_stream_is_replaced_at_once_from_where_it_stopped() -> None:
    timeout = ReadTimeoutError(None, "/api", f"Read timed out. (read timeout={READ_IDLE_S})")  # type: ignore[arg-type]
    client, waits, delivered = run([
        page("5"),
        Stream(200, [event("ADDED", "b", "6"), timeout]),
        Stream(200, [event("DELETED", "b", "7")]),
    ])
    assert [q.get("resourceVersion") for q, _ in client.requests][:3] == [None, "5", "6"]
    assert waits[0] == 0.5  # the first failure after a success: the base delay
    assert ("DELETED", "b") in delivered


def test_410_gone_lists_again_and_an_error_event_backs_off_then_lists_again() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    internal = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd hiccup"}}
    client, waits, delivered = run([
        page("5"),
        Stream(200, [json.dumps(gone).encode() + b"\n"]),
        page("50", "a"),
        Stream(200, [json.dumps(internal).encode() + b"\n"]),
        page("60", "a"),
        Stream(410),  # HTTP 410 on the watch request itself
        page("70"),
    ])
    kinds = ["watch" if "watch" in q else "list" for q, _ in client.requests]
    assert kinds[:7] == ["list", "watch", "list", "watch", "list", "watch", "list"]
    assert waits[0] == 0.5  # the 500 error event backed off; the two 410s did not wait
    assert [d for d in delivered if d[0] == "list"] == [("list", []), ("list", ["a"]), ("list", ["a"]), ("list", [])]


def test_the_backoff_resets_when_the_server_answers_after_an_outage() -> None:
    """The API server stops (refused connections), comes back answering 503 while it starts, then serves:
    the waits stay short throughout and the watch resumes where it was."""
    outage = [refused() for _ in range(6)]
    client, waits, _delivered = run([
        page("5"),
        Stream(200, [event("ADDED", "a", "6"), ProtocolError("Connection broken")]),
        *outage,
        Stream(503, data=b"apiserver not ready"),
        Stream(503, data=b"apiserver not ready"),
        Stream(200, [event("MODIFIED", "a", "8")]),
    ])
    assert waits[:9] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 0.5, 1.0]
    resumed = [q for q, _ in client.requests if q.get("resourceVersion") == "6"]
    assert len(resumed) == 9  # every retry resumed from the last event seen; none listed again
    assert sum("watch" not in q for q, _ in client.requests) == 1


def test_stop_ends_a_wait_at_once() -> None:
    client = FakeApiClient([])
    inf = Informer(client, KIND_BY_NAME["ConfigMap"], None, DirectLoop(),  # type: ignore[arg-type]
                   on_list=lambda *a: None, on_event=lambda *a: None)
    client.informer = inf
    inf.stop()
    assert inf.sleep(30) is True  # the default wait is on the stop event: it returns at once once stopped
