"""kopf handlers. Each one only forwards an event to ``EngineLoops``; decisions live in ``desired``."""

from __future__ import annotations

import logging
from typing import Any, Callable

import kopf

from kvpilot import GROUP, PLURAL, VERSION
from kvpilot.desired.plan import Settings
from kvpilot.k8s.api import Api
from kvpilot.k8s.cache import CHILD_KINDS
from kvpilot.loop import EngineLoops

MANAGED = {"app.kubernetes.io/managed-by": "kvpilot"}
log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kvpilot posts its own, specific Events; kopf's per-handler chatter would bury them.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    # Filter children on the server: without it every pod, Job and Deployment of the cluster is streamed
    # to the operator and dropped client-side. Claims are the exception (a user's claim has no label).
    for kind in CHILD_KINDS:
        if kind.managed_only:
            settings.watching.label_selectors[kind.group, kind.plural] = "app.kubernetes.io/managed-by=kvpilot"
    api = Api(pool_size=memo.api_pool_size)
    memo.loops = EngineLoops(api, memo.settings, memo.resync_seconds, memo.concurrent_reconciles)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.loops.stop_all()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_engine_event(event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.observe(event.get("type"), dict(body))


def _cache_child(kind: str) -> Callable[..., Any]:
    """An index handler: kopf calls it for every listed or changed object of ``kind``, and starts no other
    handler (so no engine loop) before every indexed kind has been listed once: the cache is primed first.
    It returns None, so kopf itself keeps no copy."""
    async def index(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # async: on the loop, not a thread
        memo.loops.child_changed(kind, dict(body))
    index.__name__ = f"kvpilot_{kind.lower()}s"
    return index


def _forget_child(kind: str) -> Callable[..., Any]:
    """Index handlers are not called for deletions: this event handler drops the object from the cache."""
    async def on_event(event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        if event.get("type") == "DELETED":
            memo.loops.child_deleted(kind, dict(body))
    on_event.__name__ = f"forget_{kind.lower()}"
    return on_event


for _kind in CHILD_KINDS:
    _labels = MANAGED if _kind.managed_only else None
    kopf.index(_kind.group, _kind.version, _kind.plural, labels=_labels, id=f"cache-{_kind.kind}")(
        _cache_child(_kind.kind))
    kopf.on.event(_kind.group, _kind.version, _kind.plural, labels=_labels, id=f"forget-{_kind.kind}",
                  when=lambda event, **_: event.get("type") == "DELETED")(_forget_child(_kind.kind))


def memo_for(settings: Settings, resync_seconds: float, concurrent_reconciles: int = 16,
             api_pool_size: int = 16) -> kopf.Memo:
    return kopf.Memo(settings=settings, resync_seconds=resync_seconds, concurrent_reconciles=concurrent_reconciles,
                     api_pool_size=api_pool_size)
