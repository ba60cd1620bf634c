"""Kubernetes Events derived from what changed between the previous and the new status.

Deriving them from the status diff (rather than emitting them where things happen) keeps them exactly
once per transition, even when a reconcile is repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # PascalCase, specific
    message: str


def events_between(old: dict[str, Any], new: dict[str, Any]) -> list[Event]:
    out: list[Event] = []
    ob, nb = old.get("build") or {}, new.get("build") or {}
    if nb and (nb.get("fingerprint"), nb.get("state")) != (ob.get("fingerprint"), ob.get("state")):
        fp, job = nb.get("fingerprint", "")[:10], nb.get("job")
        if nb["state"] == "Building":
            out.append(Event("Normal", "EngineBuildStarted", f"Job {job} builds engine {fp}"))
        elif nb["state"] == "Succeeded":
            out.append(Event("Normal", "EngineBuilt", f"Job {job} published engine {fp}"))
        elif nb["state"] == "CacheHit":
            out.append(Event("Normal", "EngineCacheHit", f"Engine {fp} is already in the cache; no build"))
        elif nb["state"] == "Failed":
            out.append(Event("Warning", "EngineBuildFailed", f"Job {job} failed: {nb.get('message', '')[-512:]}"))
    oe, ne = (old.get("engine") or {}).get("fingerprint"), (new.get("engine") or {}).get("fingerprint")
    if ne and oe and ne != oe:
        out.append(Event("Normal", "RolloutStarted", f"Rolling out engine {ne[:10]} (was {oe[:10]})"))
    obat, nbat = old.get("batching") or {}, new.get("batching") or {}
    if obat.get("maxBatchSize") and nbat.get("maxBatchSize") != obat.get("maxBatchSize"):
        out.append(
            Event("Normal", "BatchSizeChanged",
                  f"Runtime max_batch_size {obat['maxBatchSize']} -> {nbat['maxBatchSize']} ({nbat.get('reason')}): "
                  f"{nbat.get('message', '')}"[:1024])
        )
    orec = (old.get("autotune") or {}).get("recommendation") or {}
    nrec = (new.get("autotune") or {}).get("recommendation") or {}
    if nrec and nrec.get("action") != "Hold" and not nrec.get("applied") and nrec != orec:
        out.append(Event("Normal", "AutotuneRecommendation",
                         f"Recommend {nrec['action']} to {nrec.get('toBatchSize')}: {nrec.get('message', '')}"[:1024]))
    odeg = {c["type"]: c for c in old.get("conditions") or []}.get("Degraded", {})
    ndeg = {c["type"]: c for c in new.get("conditions") or []}.get("Degraded", {})
    if ndeg.get("status") == "True" and (odeg.get("status"), odeg.get("reason")) != ("True", ndeg.get("reason")):
        if ndeg.get("reason") != "BuildFailed":  # already reported as EngineBuildFailed
            out.append(Event("Warning", ndeg["reason"], ndeg.get("message", "")))
    return out
