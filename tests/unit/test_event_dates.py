"""Events are dated by the recorder's injected wall clock (like its aggregation window, by its injected
monotonic clock): a test on a fake date writes the same Events on any day."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from kvpilot.k8s.events import AGGREGATE_WINDOW_SECONDS, EventRecorder

FAKE_DATE = datetime(2001, 2, 3, 4, 5, 6, tzinfo=timezone.utc)


class _Api:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patches: list[dict[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append(obj)
        return {**obj, "metadata": {**obj["metadata"], "name": f"e1.{len(self.created)}"}}

    async def merge_patch(self, api_version: str, kind: str, name: str, ns: str, patch: dict[str, Any]) -> Any:
        self.patches.append(patch)
        return {}


def test_events_carry_the_injected_date() -> None:
    elapsed = [0.0]
    api = _Api()
    rec = EventRecorder(api, clock=lambda: elapsed[0],  # type: ignore[arg-type]
                        wall_clock=lambda: FAKE_DATE.timestamp() + elapsed[0])
    involved = {"metadata": {"name": "e1", "namespace": "ns", "uid": "u1"}}

    async def main() -> None:
        await rec.record(involved, "Warning", "ApplyFailed", "Could not apply Deployment e1")
        elapsed[0] += 90  # within the aggregation window: the same Event, counted
        await rec.record(involved, "Warning", "ApplyFailed", "Could not apply Deployment e1")
        elapsed[0] += AGGREGATE_WINDOW_SECONDS + 1  # past it: a new Event
        await rec.record(involved, "Warning", "ApplyFailed", "Could not apply Deployment e1")

    asyncio.run(main())
    first, second = api.created
    assert first["firstTimestamp"] == first["lastTimestamp"] == "2001-02-03T04:05:06Z"
    assert api.patches == [{"count": 2, "lastTimestamp": "2001-02-03T04:06:36Z"}]
    assert second["firstTimestamp"] == "2001-02-03T04:16:37Z"
