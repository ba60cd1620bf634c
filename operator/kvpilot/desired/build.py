"""Which engine to build and which one serves.

The rule that protects users: the engine in service only changes to an engine that is published in the
cache. A build that runs or fails leaves the last good engine (``status.engine``) serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvpilot.api.conditions import rfc3339
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.desired import labels as L
from kvpilot.desired.fingerprint import compute_fingerprint
from kvpilot.desired.observed import Observed
from kvpilot.desired.redact import redact
from kvpilot.trtllm.build import CACHE_MOUNT
from kvpilot.trtllm.build_script import manifest as engine_manifest
from kvpilot.trtllm.serve import ServedEngine
from kvpilot.trtllm.surface import clean_record


@dataclass(frozen=True)
class BuildDecision:
    fingerprint: str
    ceiling: int
    image: str
    ready: dict[str, Any] | None  # the published manifest when the engine is in the cache
    create_job: bool
    record_in_index: dict[str, Any] | None  # a manifest to add to the engine index
    status: dict[str, Any] | None  # status.build


def engine_ceiling(spec: InferenceEngineSpec, status: dict[str, Any]) -> int:
    """The build max_batch_size in force: the spec's, or higher if the tuner asked for a rebuild."""
    tune = status.get("autotune") or {}
    requested = tune.get("ceilingRequest") or 0
    # A request holds only against the spec ceiling it was made from: a new build.maxBatchSize wins.
    same_spec = tune.get("ceilingRequestFrom") == spec.build.max_batch_size
    if spec.autotune.enabled and spec.autotune.allow_rebuild and spec.autotune.mode == "Auto" and same_spec:
        return max(spec.build.max_batch_size, int(requested))
    return spec.build.max_batch_size


def target_fingerprint(spec: InferenceEngineSpec, status: dict[str, Any], image: str) -> tuple[int, str]:
    """(ceiling, fingerprint) of the engine the spec (and the tuner's ceiling request) asks for."""
    ceiling = engine_ceiling(spec, status)
    return ceiling, compute_fingerprint(spec, image, ceiling)


def decide_build(
    spec: InferenceEngineSpec, observed: Observed, image: str, generation: int, now: datetime,
    claim_exists: bool = True, claim: str | None = None,
) -> BuildDecision:
    ceiling, fp = target_fingerprint(spec, observed.status, image)
    previous = observed.status.get("build") or {}
    same = previous.get("fingerprint") == fp
    base = {"fingerprint": fp, "job": L.build_job_name(fp, claim, observed.claim_uid),
            "observedGeneration": generation}

    def decision(**kw: Any) -> BuildDecision:
        return BuildDecision(fingerprint=fp, ceiling=ceiling, image=image, **kw)

    if not spec.builds_engine:
        return decision(ready=None, create_job=False, record_in_index=None, status=None)
    published = observed.engine_index.get(fp)
    if published is not None:
        state = previous if same and previous.get("state") in ("Succeeded", "CacheHit") else {
            **base, "state": "CacheHit", "finishedAt": rfc3339(now)}
        return decision(ready=published, create_job=False, record_in_index=None, status=state)
    job = observed.job
    if job is not None and job.succeeded:
        manifest = job.manifest() or engine_manifest(spec, fp, image, ceiling)
        finished = job.completion_time or rfc3339(now)
        manifest = {**manifest, "builtAt": manifest.get("builtAt", finished), "buildJob": job.name}
        state = {**base, "state": "Succeeded", "startedAt": job.start_time, "finishedAt": finished}
        return decision(ready=manifest, create_job=False, record_in_index=manifest, status=state)
    if job is not None and job.failed:
        state = {**base, "state": "Failed", "message": redact(job.message[-4000:]), "startedAt": job.start_time,
                 "finishedAt": job.completion_time or (previous.get("finishedAt") if same else None) or rfc3339(now)}
        return decision(ready=None, create_job=False, record_in_index=None, status=state)
    if job is not None:
        state = {**base, "state": "Building", "startedAt": job.start_time or previous.get("startedAt") or rfc3339(now)}
        return decision(ready=None, create_job=False, record_in_index=None, status=state)
    if not claim_exists:  # nothing can build before the cache volume exists
        return decision(ready=None, create_job=False, record_in_index=None, status=previous if same else None)
    # No Job: build. A failed Job is kept for its TTL (a day), so a failure is retried at most once a day,
    # at once when someone deletes the Job, or when the build inputs (the fingerprint) change.
    state = {**base, "state": "Building", "startedAt": rfc3339(now)}
    return decision(ready=None, create_job=True, record_in_index=None, status=state)


def served_engine(
    spec: InferenceEngineSpec, build: BuildDecision, status: dict[str, Any], claim: str | None
) -> tuple[ServedEngine | None, dict[str, Any] | None]:
    """The engine the pods serve, and status.engine: the new one once published, else the last good one."""
    if not spec.builds_engine:
        plain = {"fingerprint": build.fingerprint, "path": spec.model.source, "image": build.image,
                "tensorParallelSize": spec.build.tensor_parallel_size,
                "pipelineParallelSize": spec.build.pipeline_parallel_size}
        return None, plain
    info: dict[str, Any]
    if build.ready is not None:
        m = build.ready
        info = {
            "fingerprint": build.fingerprint,
            "path": f"{CACHE_MOUNT}/{build.fingerprint}",
            "claimName": claim,
            "image": m.get("image", build.image),
            "maxBatchSize": int(m.get("maxBatchSize", build.ceiling)),
            "maxNumTokens": int(m.get("maxNumTokens", spec.build.max_num_tokens)),
            "maxSeqLen": int(m.get("maxSeqLen", spec.build.max_seq_len)),
            "tokensPerBlock": int(m.get("tokensPerBlock", spec.build.kv_cache.tokens_per_block)),
            "tensorParallelSize": int(m.get("tensorParallelSize", spec.build.tensor_parallel_size)),
            "pipelineParallelSize": int(m.get("pipelineParallelSize", spec.build.pipeline_parallel_size)),
            "builtAt": m.get("builtAt"),
            "buildJob": m.get("buildJob", L.build_job_name(build.fingerprint, claim)),
            # What the build Job found the serving image to be (trtllm/probe.py): serving renders from it.
            "trtllm": clean_record(m.get("trtllm")),
        }
        info = {k: v for k, v in info.items() if v is not None}
    else:
        info = status.get("engine") or {}
        if not info or "maxBatchSize" not in info:
            return None, None
    engine = ServedEngine(
        fingerprint=info["fingerprint"],
        max_batch_size=info["maxBatchSize"],
        max_num_tokens=info.get("maxNumTokens", spec.build.max_num_tokens),
        tensor_parallel_size=info.get("tensorParallelSize", 1),
        pipeline_parallel_size=info.get("pipelineParallelSize", 1),
    )
    return engine, info
