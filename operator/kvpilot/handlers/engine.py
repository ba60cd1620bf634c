"""kopf handlers. Each one only forwards an event to ``EngineLoops``; decisions live in ``desired``."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot import GROUP, PLURAL, VERSION
from kvpilot.desired.settings import Settings
from kvpilot.k8s.api import Api
from kvpilot.loop import EngineLoops

log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kvpilot posts its own, specific Events; kopf's per-handler chatter would bury them.
    settings.posting.level = logging.WARNING
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # "Handler succeeded" per watch event
    settings.watching.server_timeout = 60
    api = Api(pool_size=memo.api_pool_size)
    memo.loops = EngineLoops(api, memo.settings, memo.resync_seconds, memo.concurrent_reconciles)
    # Children are read from a watch cache of kvpilot's own (k8s/informer.py), filtered on the server by label
    # (claims excepted: a user's claim has none); kopf watches only the InferenceEngines.
    memo.loops.start_informers(list(memo.namespaces))
    if memo.get("gpu_capacity", True):
        memo.loops.start_gpu_informers()  # free GPUs per node, for serving.rollout.strategy Auto


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.loops.stop_all()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_engine_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.observe(event.get("type"), dict(body))


def memo_for(settings: Settings, resync_seconds: float, concurrent_reconciles: int = 16,
             api_pool_size: int = 16, namespaces: list[str] | None = None, gpu_capacity: bool = True) -> kopf.Memo:
    return kopf.Memo(settings=settings, resync_seconds=resync_seconds, concurrent_reconciles=concurrent_reconciles,
                     api_pool_size=api_pool_size, namespaces=namespaces or [], gpu_capacity=gpu_capacity)
