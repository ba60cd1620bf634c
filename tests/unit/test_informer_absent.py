"""An informer of a kind whose API is not served (a LeaderWorkerSet watch where the LWS CRD is not installed):
it reports an empty list, so the watch cache syncs and every other engine reconciles, and lists again later."""

from __future__ import annotations

import threading
from typing import Any

from kvpilot.k8s import informer as inf
from kvpilot.k8s.cache import ChildKind

LWS = ChildKind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", keep_spec=True)


class Resp:
    status = 404

    def read(self) -> bytes:
        return b"404 page not found"


class Api:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def param_serialize(self, method: str, path: str, **_: Any) -> tuple[str, str, dict[str, str], None, None]:
        return method, path, {}, None, None

    def call_api(self, method: str, url: str, **_: Any) -> Resp:
        self.calls.append(url)
        return Resp()


class Loop:
    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        fn(*args)


def test_a_kind_that_is_not_served_lists_as_empty_once_and_is_checked_again(monkeypatch: Any) -> None:
    monkeypatch.setattr(inf, "ABSENT_RECHECK_SECONDS", 0.05)
    lists: list[tuple[str, list[Any]]] = []
    listed_twice = threading.Event()
    api = Api()

    def on_list(kind: str, items: list[Any]) -> None:
        lists.append((kind, items))

    informer = inf.Informer(api, LWS, None, Loop(), on_list, lambda *a: None)  # type: ignore[arg-type]
    informer.start()
    try:
        for _ in range(200):
            if len(api.calls) >= 3:
                listed_twice.set()
                break
            threading.Event().wait(0.02)
    finally:
        informer.stop()
        informer.thread.join(5)
    assert listed_twice.is_set(), api.calls
    assert api.calls[0] == "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets"
    assert lists == [("LeaderWorkerSet", [])]  # reported once, not at every check
