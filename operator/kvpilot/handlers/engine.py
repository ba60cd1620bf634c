"""kopf handlers. Each one only forwards an event to ``EngineLoops``; decisions live in ``desired``."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot import GROUP, PLURAL, VERSION, defaults
from kvpilot.desired.settings import Settings
from kvpilot.k8s.api import Api
from kvpilot.k8s.writes import ChildWriter
from kvpilot.loop import EngineLoops

log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kvpilot posts its own, specific Events; kopf's per-handler chatter would bury them.
    settings.posting.level = logging.WARNING
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # "Handler succeeded" per watch event
    settings.watching.server_timeout = 60
    api = Api(pool_size=memo.api_pool_size)
    # The operator's one write layer: shared-Job creates, writes in flight and their late failures live there.
    memo.loops = EngineLoops(api, memo.settings, memo.resync_seconds, memo.concurrent_reconciles,
                             writer=ChildWriter(api))
    # Children are read from a watch cache of kvpilot's own (k8s/informer.py), filtered on the server by label
    # (claims excepted: a user's claim has none); kopf watches only the InferenceEngines.
    memo.loops.watches.start(list(memo.namespaces))
    if memo.get("gpu_capacity", True):
        memo.loops.watches.start_gpu()  # free GPUs per node, for serving.rollout.strategy Auto


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.loops.stop_all()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_engine_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.observe(event.get("type"), dict(body))


def memo_for(settings: Settings, resync_seconds: float,
             concurrent_reconciles: int = defaults.CONCURRENT_RECONCILES, api_pool_size: int = defaults.API_POOL_SIZE,
             namespaces: list[str] | None = None, gpu_capacity: bool = True) -> kopf.Memo:
    return kopf.Memo(settings=settings, resync_seconds=resync_seconds, concurrent_reconciles=concurrent_reconciles,
                     api_pool_size=api_pool_size, namespaces=namespaces or [], gpu_capacity=gpu_capacity)
