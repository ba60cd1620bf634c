"""``query_prometheus`` against a real HTTP server on loopback (``http.server`` in a thread), reached the way the
operator reaches a Prometheus it was pinned to (``--resolve``): good answers become the tuner's window, bad and
hostile ones a ``MetricsRejected`` naming what is wrong, a redirect is not followed, a server that does not
answer times out, and a URL the SSRF rules refuse is never fetched."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest

from kvpilot.api.metrics_url import MetricsPin
from kvpilot.desired.observed import KvWindow
from kvpilot.observe import prometheus
from kvpilot.observe.prometheus import query_prometheus
from kvpilot.observe.replies import MAX_BODY_BYTES
from kvpilot.trtllm.metrics import MetricsRejected
from tests.unit.test_prometheus_source import as_matrix, scrape

HOST = "prometheus.monitoring.svc"


@dataclass
class Prometheus:
    """What the fake server answers (status, headers, body) per path, and every request it received."""

    port: int = 0
    answers: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # a "hang" answer waits for this

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pins(self) -> tuple[MetricsPin, ...]:
        return (MetricsPin(HOST, self.port, "127.0.0.1"),)

    def answer(self, body: Any, status: int = 200, path: str = "/api/v1/query",
               headers: dict[str, str] | None = None) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers[path] = (status, {"Content-Type": "application/json", **(headers or {})}, raw)


@pytest.fixture
def server() -> Iterator[Prometheus]:
    state = Prometheus()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            path = urlsplit(self.path).path
            state.requests.append((self.path, dict(self.headers)))
            status, headers, body = state.answers.get(path, (404, {}, b"not found"))
            if headers.get("X-Hang"):
                state.release.wait(10)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()


def query(server: Prometheus, url: str | None = None, **kwargs: Any) -> KvWindow | None:
    async def run() -> KvWindow | None:
        async with aiohttp.ClientSession() as session:
            return await query_prometheus(session, url or server.url, "ns", "e", 30, pins=server.pins, **kwargs)

    return asyncio.run(run())


def success(result: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


TEXTS = [(100.0, scrape(100, 0, 10, 0, 5)), (102.0, scrape(400, 3, 12, 8, 15)), (104.0, scrape(300, 5, 12, 18, 25))]


def test_a_good_answer_is_the_window_of_the_engines_pods(server: Prometheus) -> None:
    server.answer(success(as_matrix("e-1", TEXTS) + as_matrix("e-old", TEXTS)))
    window = query(server, live_pods={"e-1"}, slo_ttft_ms=1000)
    assert window is not None and window.pods == 1 and window.samples == 3  # e-old left out
    assert window.peak_used_blocks == 400 and window.max_blocks == 1000 and window.peak_queued == 5
    assert window.ttft_miss_fraction is not None and abs(window.ttft_miss_fraction - 0.9) < 1e-9
    (path, headers), = server.requests
    params = parse_qs(urlsplit(path).query)
    assert urlsplit(path).path == "/api/v1/query"
    assert params["query"] == ['{namespace="ns",engine="e",pod!=""}[30s]']
    assert headers["Host"] == f"{HOST}:{server.port}"  # the pinned address is dialled, the name still sent


def test_no_sample_of_the_engine_is_no_window(server: Prometheus) -> None:
    server.answer(success([]))
    assert query(server) is None


@pytest.mark.parametrize("status,body,reason,words", [
    (200, {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, "query", "parse error"),
    (502, b"<html><body>502 Bad Gateway</body></html>", "syntax", "not JSON"),
    (200, [1, 2, 3], "shape", "list, not an object"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "shape", "not the matrix"),
    (200, success([{"metric": {"__name__": "x", "pod": "p"}, "values": [[1, None]]}]), "type", "values[0][1]"),
    (200, success([{"metric": {"pod": 7}, "values": []}]), "type", "metric must map strings"),
    (200, b'{"status": "success", "data": {"result": [NaN]}}', "value", "NaN"),
    (200, b"[" * 100_000 + b"]" * 100_000, "syntax", "not JSON"),
    (200, b"\xff\xfe not utf-8", "syntax", "not JSON"),
], ids=["query-error", "proxy-error-page", "top-level-list", "vector", "null-value", "non-string-label",
        "nan-literal", "deep-nesting", "bad-utf8"])
def test_bad_and_hostile_answers_are_rejected_with_the_reason(server: Prometheus, status: int, body: Any,
                                                               reason: str, words: str) -> None:
    server.answer(body, status=status)
    with pytest.raises(MetricsRejected) as info:
        query(server)
    assert info.value.reason == reason and words in str(info.value)


def test_an_answer_too_large_is_refused_without_reading_it_all(server: Prometheus) -> None:
    server.answer(b" " * (MAX_BODY_BYTES + 1))
    with pytest.raises(MetricsRejected, match="larger than") as info:
        query(server)
    assert info.value.reason == "size"


def test_a_redirect_is_not_followed(server: Prometheus) -> None:
    """A Prometheus (or whatever answers at its name) cannot send the operator elsewhere: a 302's target is
    never fetched, even on the same server, and its empty body is a rejection, not a window."""
    server.answer(b"", status=302, headers={"Location": f"http://127.0.0.1:{server.port}/elsewhere"})
    server.answer(success(as_matrix("e-1", TEXTS)), path="/elsewhere")
    with pytest.raises(MetricsRejected):
        query(server)
    assert [urlsplit(p).path for p, _ in server.requests] == ["/api/v1/query"]


def test_a_server_that_does_not_answer_times_out(server: Prometheus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "TIMEOUT", aiohttp.ClientTimeout(total=0.3))
    server.answer(success([]), headers={"X-Hang": "1"})
    with pytest.raises(TimeoutError):
        query(server)
    assert len(server.requests) == 1  # it was asked, and did not answer in time


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}", "http://localhost:{port}/",
                                 "http://metadata.google.internal.svc:{port}", "http://{host}:{port}/?q=1"])
def test_a_url_the_rules_refuse_is_never_fetched(server: Prometheus, url: str) -> None:
    server.answer(success(as_matrix("e-1", TEXTS)))
    with pytest.raises(ValueError, match="refused"):
        query(server, url=url.format(port=server.port, host=HOST))
    assert server.requests == []


def test_an_unpinned_name_is_resolved_and_checked_before_any_request(server: Prometheus) -> None:
    """Without ``--resolve`` the name's addresses are checked first (loopback and metadata
    addresses: test_pod_hardening.py); here the name does not resolve, so the query is refused and nothing is sent."""
    server.answer(success(as_matrix("e-1", TEXTS)))

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            await query_prometheus(session, server.url, "ns", "e", 30)  # no pins

    with pytest.raises(ValueError, match="refused"):
        asyncio.run(run())
    assert server.requests == []
