"""Which engine to build (or, on the PyTorch backend, which checkpoint to prepare) and which one serves.

The rule that protects users: the engine in service only changes to an engine that is published in the
cache. A build or prepare that runs or fails leaves the last good engine (``status.engine``) serving; one that
cannot run on its image (a TensorRT engine on a release without the TensorRT backend) is refused before any Job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from kvpilot.api.timestamps import parse_rfc3339, rfc3339
from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.status import (
    AutotuneStatus,
    BuildState,
    BuildStatus,
    EngineInfo,
    EngineStatus,
    TrtllmRecord,
    parse_record,
)
from kvpilot.desired import labels as L
from kvpilot.desired.fingerprint import compute_fingerprint
from kvpilot.desired.observed import JobState, Observed
from kvpilot.desired.redact import redact
from kvpilot.trtllm.build import CACHE_MOUNT
from kvpilot.trtllm.build_script import manifest as engine_manifest
from kvpilot.trtllm.prepare import prepare_manifest
from kvpilot.trtllm.serve import ServedEngine, serving_surface
from kvpilot.trtllm.surface import clean_record


# A build retry the user asks for (a tenant holding kvpilot-edit cannot delete the failed Job, and a failed Job is
# kept a day): the time of the request, as RFC 3339. A build whose Job failed before that time is built once more,
# by a Job of its own name (the failed one stays, with its logs); one that fails after it is not retried again.
RETRY_ANNOTATION = "serving.kvpilot.io/retry-build"
RETRY_HINT = (f"To build it again, annotate the InferenceEngine with the time: kubectl annotate inferenceengine "
              f"<name> {RETRY_ANNOTATION}=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite")
RETRY_CLOCK_SKEW = timedelta(minutes=5)  # a request dated this far ahead of the operator's clock still counts


def retry_job_name(job: str, request: str) -> str:
    """The Job that builds again what ``job`` failed to build, at the request dated ``request``."""
    return f"{job}-r{hashlib.sha256(request.encode()).hexdigest()[:8]}"


def retry_requested(job: JobState, request: str | None, now: datetime) -> bool:
    """Whether the failed ``job`` is to be built again: the request is a time (RFC 3339) after the failure, and not
    in the future (a request dated ahead would retry builds that fail later, unasked)."""
    if not request or not job.failed or not job.failed_at:
        return False
    try:
        asked = parse_rfc3339(request, now.tzinfo)
        failed = parse_rfc3339(job.failed_at, now.tzinfo)
    except ValueError:
        return False
    return failed < asked <= now + RETRY_CLOCK_SKEW


@dataclass(frozen=True)
class BuildDecision:
    fingerprint: str
    ceiling: int
    image: str
    ready: dict[str, Any] | None  # the published manifest when the engine is in the cache
    create_job: bool
    record_in_index: dict[str, Any] | None  # a manifest to add to the engine index
    status: BuildStatus | None  # status.build

    @property
    def building(self) -> bool:
        """A build of the engine the spec asks for is under way (and no published engine makes it moot)."""
        return self.ready is None and self.status is not None and self.status.state == BuildState.BUILDING


def engine_ceiling(spec: InferenceEngineSpec, status: EngineStatus) -> int:
    """The build max_batch_size in force: the spec's, or higher if the tuner asked for a rebuild."""
    tune = status.autotune or AutotuneStatus()
    requested = tune.ceiling_request or 0
    # A request holds only against the spec ceiling it was made from: a new build.maxBatchSize wins.
    same_spec = tune.ceiling_request_from == spec.build.max_batch_size
    if spec.autotune.enabled and spec.autotune.allow_rebuild and spec.autotune.mode == "Auto" and same_spec:
        return max(spec.build.max_batch_size, requested)
    return spec.build.max_batch_size


def target_fingerprint(spec: InferenceEngineSpec, status: EngineStatus, image: str) -> tuple[int, str]:
    """(ceiling, fingerprint) of the engine the spec (and the tuner's ceiling request) asks for."""
    ceiling = engine_ceiling(spec, status)
    return ceiling, compute_fingerprint(spec, image, ceiling)


def decide_build(
    spec: InferenceEngineSpec, observed: Observed, *, image: str, generation: int, now: datetime,
    claim_exists: bool = True, claim: str | None = None,
) -> BuildDecision:
    ceiling, fp = target_fingerprint(spec, observed.status, image)
    previous = observed.status.build or BuildStatus()
    same = previous.fingerprint == fp
    job_name = observed.job.name if observed.job is not None else L.build_job_name(fp, claim, observed.claim_uid)
    base = BuildStatus(fingerprint=fp, job=job_name, observed_generation=generation)

    def decision(**kw: Any) -> BuildDecision:
        return BuildDecision(fingerprint=fp, ceiling=ceiling, image=image, **kw)

    if not spec.builds_engine:
        return decision(ready=None, create_job=False, record_in_index=None, status=None)
    published = observed.engine_index.get(fp)
    if published is not None:
        state = previous if same and previous.state in (BuildState.SUCCEEDED, BuildState.CACHE_HIT) else replace(
            base, state=BuildState.CACHE_HIT, finished_at=rfc3339(now))
        return decision(ready=published, create_job=False, record_in_index=None, status=state)
    _surface, how, refused = serving_surface(spec, image, None)
    if how == "refused" and refused:  # no Job at all: it would fail inside the image after the download
        kept = same and previous.state == BuildState.FAILED and previous.message == refused
        state = previous if kept else replace(base, state=BuildState.FAILED, message=refused,
                                              finished_at=rfc3339(now))
        return decision(ready=None, create_job=False, record_in_index=None, status=state)
    job = observed.job
    if job is not None and job.succeeded:
        manifest = job.manifest() or _manifest(spec, fp, image, ceiling)
        finished = job.completion_time or rfc3339(now)
        manifest = {**manifest, "builtAt": manifest.get("builtAt", finished), "buildJob": job.name}
        state = replace(base, state=BuildState.SUCCEEDED, started_at=job.start_time, finished_at=finished)
        return decision(ready=manifest, create_job=False, record_in_index=manifest, status=state)
    if job is not None and job.failed and retry_requested(job, observed.retry_build, now):
        retry = replace(base, job=retry_job_name(job.name, observed.retry_build or ""), state=BuildState.BUILDING,
                        started_at=rfc3339(now))
        return decision(ready=None, create_job=True, record_in_index=None, status=retry)
    if job is not None and job.failed:
        state = replace(base, state=BuildState.FAILED, message=redact(job.message[-4000:]), started_at=job.start_time,
                        finished_at=job.completion_time or (previous.finished_at if same else None) or rfc3339(now))
        return decision(ready=None, create_job=False, record_in_index=None, status=state)
    if job is not None:
        state = replace(base, state=BuildState.BUILDING,
                        started_at=job.start_time or previous.started_at or rfc3339(now))
        return decision(ready=None, create_job=False, record_in_index=None, status=state)
    if not claim_exists or observed.claim_terminating:  # nothing can build before the volume exists, or as it goes
        return decision(ready=None, create_job=False, record_in_index=None, status=previous if same else None)
    # No Job: build. A failed Job is kept for its TTL (a day), so a failure is retried at most once a day,
    # at once when someone deletes the Job, or when the build inputs (the fingerprint) change.
    state = replace(base, state=BuildState.BUILDING, started_at=rfc3339(now))
    return decision(ready=None, create_job=True, record_in_index=None, status=state)


def _manifest(spec: InferenceEngineSpec, fingerprint: str, image: str, ceiling: int) -> dict[str, Any]:
    """What a Job that wrote no manifest published (the one its script would have written)."""
    if spec.prepares_checkpoint:
        return prepare_manifest(spec, fingerprint, image, spec.batching.max_batch_size)
    return engine_manifest(spec, fingerprint, image, ceiling)


def pytorch_ceiling(spec: InferenceEngineSpec) -> int:
    """A prepared PyTorch checkpoint has no engine ceiling: the runtime limit may go wherever the spec lets it (the
    tuner's bounds, or the spec's value), and follows the spec as it changes rather than the manifest."""
    return max(spec.autotune.max_batch_size, spec.batching.max_batch_size)


_MAX_COUNT = 2**31 - 1  # the API server's int32 fields (replicas, ports) bound what a sane manifest holds


def _count(manifest: dict[str, Any], key: str, default: int) -> int:
    """A positive count from a published manifest, else ``default``: the manifest comes from an engine-index
    ConfigMap or a build pod's termination message, both writable by hand, and must not fail every reconcile."""
    value = manifest.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_COUNT:
        return value
    return default


def _text(manifest: dict[str, Any], key: str, default: str | None) -> str | None:
    """A non-empty string from a published manifest, else ``default`` (see _count)."""
    value = manifest.get(key)
    return value if isinstance(value, str) and value else default


def served_engine(
    spec: InferenceEngineSpec, build: BuildDecision, status: EngineStatus, claim: str | None
) -> tuple[ServedEngine | None, EngineInfo | None]:
    """The engine the pods serve, and status.engine: the new one once published, else the last good one."""
    if not spec.builds_engine:
        return None, EngineInfo(fingerprint=build.fingerprint, path=spec.model.source, image=build.image,
                                tensor_parallel_size=spec.build.tensor_parallel_size,
                                pipeline_parallel_size=spec.build.pipeline_parallel_size)
    if build.ready is not None:
        m = build.ready
        info = EngineInfo(
            fingerprint=build.fingerprint,
            path=f"{CACHE_MOUNT}/{build.fingerprint}",
            claim_name=claim,
            image=_text(m, "image", build.image),
            max_batch_size=_count(m, "maxBatchSize", build.ceiling),
            max_num_tokens=_count(m, "maxNumTokens", spec.build.max_num_tokens),
            max_seq_len=_count(m, "maxSeqLen", spec.build.max_seq_len),
            tokens_per_block=_count(m, "tokensPerBlock", spec.build.kv_cache.tokens_per_block),
            tensor_parallel_size=_count(m, "tensorParallelSize", spec.build.tensor_parallel_size),
            pipeline_parallel_size=_count(m, "pipelineParallelSize", spec.build.pipeline_parallel_size),
            built_at=_text(m, "builtAt", None),
            build_job=_text(m, "buildJob", L.build_job_name(build.fingerprint, claim)),
            # What the build Job found the serving image to be (trtllm/probe.py): serving renders from it.
            trtllm=parse_record(TrtllmRecord, clean_record(m.get("trtllm"))),
        )
    elif status.engine is not None:
        info = status.engine
    else:
        return None, None
    if spec.prepares_checkpoint and info.fingerprint is not None:  # runtime limits only: the spec's, not the
        info = replace(info, max_batch_size=pytorch_ceiling(spec),  # manifest's
                       max_num_tokens=spec.batching.max_num_tokens)
    if info.fingerprint is None or info.max_batch_size is None:  # nothing (or a hand-edited remnant) serves
        return None, None
    engine = ServedEngine(
        fingerprint=info.fingerprint,
        max_batch_size=info.max_batch_size,
        max_num_tokens=info.max_num_tokens if info.max_num_tokens is not None else spec.build.max_num_tokens,
        tensor_parallel_size=info.tensor_parallel_size if info.tensor_parallel_size is not None else 1,
        pipeline_parallel_size=info.pipeline_parallel_size if info.pipeline_parallel_size is not None else 1,
    )
    return engine, info
