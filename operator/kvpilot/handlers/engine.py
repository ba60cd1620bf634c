"""kopf handlers. Each one only forwards an event to ``EngineLoops``; decisions live in ``desired``."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot import GROUP, PLURAL, VERSION
from kvpilot.desired.plan import Settings
from kvpilot.k8s.api import Api
from kvpilot.loop import EngineLoops

MANAGED = {"app.kubernetes.io/managed-by": "kvpilot"}
log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kvpilot posts its own, specific Events; kopf's per-handler chatter would bury them.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    # Filter children on the server: without it every pod, Job and Deployment of the cluster is streamed
    # to the operator and dropped client-side.
    for resource in (("", "pods"), ("batch", "jobs"), ("apps", "deployments")):
        settings.watching.label_selectors[resource] = "app.kubernetes.io/managed-by=kvpilot"
    memo.loops = EngineLoops(Api(), memo.settings, memo.resync_seconds)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.loops.stop_all()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_engine_event(event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.observe(event.get("type"), dict(body))


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def on_child_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.wake_owners(dict(body))


def memo_for(settings: Settings, resync_seconds: float) -> kopf.Memo:
    return kopf.Memo(settings=settings, resync_seconds=resync_seconds)
