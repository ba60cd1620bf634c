"""Events, aggregated the way the Kubernetes event recorder (client-go tools/record) does.

The recorder keys an event by (object, type, reason, message): the first occurrence is created, a repeat
within the window PATCHes ``count`` and ``lastTimestamp`` of the same Event instead of creating another, so
a condition flapping on a fleet of engines does not fill etcd with copies. The key cache is an LRU of bounded
size (client-go keeps 4,096 entries), so memory stays flat however many engines come and go.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from kvpilot import API_VERSION, KIND
from kvpilot.api.timestamps import rfc3339
from kvpilot.k8s.errors import NotFound

LRU_SIZE = 4096
AGGREGATE_WINDOW_SECONDS = 600.0  # client-go's default aggregation interval


@dataclass
class _Seen:
    name: str
    count: int
    first: str
    at: float  # monotonic time of the last occurrence


def _stamp(now: datetime) -> str:
    return rfc3339(now)


class EventWrites(Protocol):
    """The two writes the recorder makes (``k8s.api.Api`` has them): it needs no more of the API boundary, and
    naming only these keeps ``api`` -> ``events`` one-way (``Api`` owns a recorder)."""

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: dict[str, Any],
    ) -> dict[str, Any]: ...


class EventRecorder:
    def __init__(self, api: EventWrites, clock: Callable[[], float] | None = None, size: int = LRU_SIZE,
                 wall_clock: Callable[[], float] = time.time):
        """``clock`` (monotonic) times the aggregation window; ``wall_clock`` (seconds since the epoch) dates
        the Events. Both are injected so a test on a fake clock writes the same Events on any day."""
        self._api = api
        self._clock = clock or time.monotonic
        self._wall_clock = wall_clock
        self._size = size
        self._seen: OrderedDict[tuple[str, str, str, str, str], _Seen] = OrderedDict()

    def key(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> tuple[str, str, str, str, str]:
        meta = involved["metadata"]
        return (meta["namespace"], meta.get("uid") or meta["name"], type_, reason, message[:1024])

    async def record(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        now = datetime.fromtimestamp(self._wall_clock(), timezone.utc)
        key = self.key(involved, type_, reason, message)
        seen = self._seen.get(key)
        if seen is not None and self._clock() - seen.at < AGGREGATE_WINDOW_SECONDS:
            seen.count += 1
            seen.at = self._clock()
            self._seen.move_to_end(key)
            patch = {"count": seen.count, "lastTimestamp": _stamp(now)}
            try:
                await self._api.merge_patch("v1", "Event", seen.name, key[0], patch)
                return
            except NotFound:  # expired (the API server keeps Events an hour): create a new one
                pass
        created = await self._api.create(self._event(involved, type_, reason, message, now))
        self._seen[key] = _Seen(created["metadata"]["name"], 1, _stamp(now), self._clock())
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)

    @staticmethod
    def _event(involved: dict[str, Any], type_: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
        meta = involved["metadata"]
        return {
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
            "firstTimestamp": _stamp(now),
            "lastTimestamp": _stamp(now),
            "count": 1,
            "reportingComponent": "kvpilot",
            "reportingInstance": "kvpilot",
        }
