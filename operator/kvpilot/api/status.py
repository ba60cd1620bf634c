"""Typed, immutable models of ``InferenceEngine.status``, parsed from and serialized to the CR in this module only.

The pure layer (``kvpilot.desired``) reads and writes these classes, never camelCase dicts. Field names are the
snake_case of the schema's camelCase (``api/status_schema.py``); ``tests/unit/test_api_parity.py`` proves the two
agree field for field, in type and in the values of every enumeration.

Status is user-writable (the status subresource), so :func:`parse_status` never raises: a value of the wrong
type or outside its enumeration reads as absent, a list item that is not a well-formed record is dropped, and the
next write replaces both with what the operator decides.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Any, Literal

from kvpilot.api.wire import parse_record as parse_record  # the converters, beside the models they convert
from kvpilot.api.wire import record
from kvpilot.api.wire import to_wire as to_wire

ConditionStatus = Literal["True", "False", "Unknown"]


class BuildState(StrEnum):
    """``status.build.state``: where the build of the current fingerprint stands."""

    BUILDING = "Building"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CACHE_HIT = "CacheHit"


class BatchingSource(StrEnum):
    """``status.batching.source``: who set the runtime max_batch_size."""

    SPEC = "Spec"
    AUTOTUNE = "Autotune"


class Action(StrEnum):
    """What one autotune decision does (``status.autotune.recommendation.action``)."""

    RAISE = "Raise"
    LOWER = "Lower"
    HOLD = "Hold"
    REBUILD = "Rebuild"


@dataclasses.dataclass(frozen=True)
class ConditionRecord:
    """One entry of ``status.conditions`` (metav1.Condition) as written, with its transition time."""

    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int | None = None


@dataclasses.dataclass(frozen=True)
class TrtllmRecord:
    """``status.engine.trtllm``: what the build Job's probe found the serving image to be."""

    version: str | None = None
    trt_llm_args_has_perf_metrics_max_requests: bool | None = None
    collector_prefix: str | None = None
    collector_names: tuple[str, ...] | None = None
    probe_error: str | None = None


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """``status.engine``: the engine in service, the last one that built successfully."""

    fingerprint: str | None = None
    path: str | None = None
    claim_name: str | None = None
    image: str | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    tokens_per_block: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    built_at: str | None = None
    build_job: str | None = None
    trtllm: TrtllmRecord | None = None


@dataclasses.dataclass(frozen=True)
class BuildStatus:
    """``status.build``: the most recent build started for the current spec."""

    fingerprint: str | None = None
    job: str | None = None
    state: BuildState | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    observed_generation: int | None = None


@dataclasses.dataclass(frozen=True)
class BatchingStatus:
    """``status.batching``: the runtime max_batch_size in force and why."""

    max_batch_size: int | None = None
    source: BatchingSource | None = None
    reason: str | None = None
    message: str | None = None
    changed_at: str | None = None
    summary: str | None = None
    spec_value: int | None = None


@dataclasses.dataclass(frozen=True)
class TrafficStatus:
    """``status.kvCache.traffic``: the traffic the tuner's what-if simulation replays (the window pooled with the
    windows before it while the traffic held, autotune/pooling.py)."""

    requests_per_minute: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    arrival_cv: str | None = None
    requests: int | None = None  # the finished requests the figures stand for
    stopped_at_max_tokens: str | None = None  # the share of them that stopped at their max_tokens, a decimal
    max_tokens: int | None = None  # the requests' max_tokens as the what-if places it from that share


@dataclasses.dataclass(frozen=True)
class KvCacheStatus:
    """``status.kvCache``: the KV-cache pool as last observed."""

    utilization_percent: int | None = None
    used_blocks: int | None = None
    max_blocks: int | None = None
    tokens_per_block: int | None = None
    waiting_requests: int | None = None
    active_requests: int | None = None
    paused_requests: int | None = None
    traffic: TrafficStatus | None = None
    observed_at: str | None = None


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
    """One autotune decision as status records it."""

    at: str | None = None
    action: Action | None = None
    from_batch_size: int | None = None
    to_batch_size: int | None = None
    reason: str | None = None
    message: str | None = None
    applied: bool | None = None


class ModelTrust(StrEnum):
    """``status.autotune.model.trust``: whether the tuner trusts the engine model its what-if simulates."""

    TRUSTED = "Trusted"  # calibrated, and within the bound of what the pods show: the what-if ranks changes
    DISTRUSTED = "Distrusted"  # off by more than the bound: measured-only decisions, conservative steps
    CALIBRATING = "Calibrating"  # not enough evidence yet to say


@dataclasses.dataclass(frozen=True)
class ModelStatus:
    """``status.autotune.model``: the engine model the what-if simulates, fitted to the pods' metrics, and how
    far it is from what they show. Decimals are strings (status carries no floats)."""

    profile: str | None = None
    known: bool | None = None
    trust: ModelTrust | None = None
    hbm_efficiency: str | None = None
    prefill_mfu: str | None = None
    step_overhead_millis: str | None = None
    per_sequence_micros: str | None = None
    weight_stream_scale: str | None = None
    kv_pool_tokens: int | None = None
    iterations: int | None = None
    latency_error_percent: str | None = None
    datasheet_error_percent: str | None = None
    goodput_error_percent: str | None = None
    bound_percent: int | None = None
    message: str | None = None
    fitted_at: str | None = None


@dataclasses.dataclass(frozen=True)
class VerificationSide:
    """The pooled figures of the windows on one side of a change (autotune/verify.Side, in integers)."""

    windows_milli: int | None = None
    seconds: int | None = None
    offered: int | None = None
    resolved: int | None = None
    good: int | None = None
    answered: int | None = None
    share_permille: int | None = None  # the windows' mean share served in time
    last_share_permille: int | None = None
    successive_squares_micro: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    split: int | None = None  # answered requests whose misses per objective are known
    tpot_missed: int | None = None  # of those, the ones that missed the TPOT objective
    ttft_missed: int | None = None  # and the TTFT objective


@dataclasses.dataclass(frozen=True)
class VerificationWatch:
    """An applied change under verification."""

    changed_at: str | None = None
    from_batch_size: int | None = None
    to_batch_size: int | None = None
    before: VerificationSide | None = None
    after: VerificationSide | None = None
    in_force_at: str | None = None
    last_batch: int | None = None
    calm_at: str | None = None
    other_load: int | None = None
    worse_windows: int | None = None  # judged windows in a row whose verdict was a rollback (verify.confirm)


@dataclasses.dataclass(frozen=True)
class VerificationBar:
    """After a rollback (or a lower that did not help): no change in ``direction`` to ``batchSize`` or beyond it
    until ``until``, while the load is the one it was measured at."""

    direction: Literal["Raise", "Lower"] | None = None
    batch_size: int | None = None
    until: str | None = None
    requests_per_minute: int | None = None  # the load it was measured at (it holds only at that load)
    prompt_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class VerificationStatus:
    """``status.autotune.verification``: what the tuner measured of its last change, and what it keeps to judge
    the next one (issue 18: what is measured overrules what is predicted)."""

    outcome: Literal["Keep", "RollBack", "Undecided"] | None = None
    reason: str | None = None
    message: str | None = None
    decided_at: str | None = None
    watch: VerificationWatch | None = None
    baseline_batch_size: int | None = None
    baseline: VerificationSide | None = None
    baseline_in_force_at: str | None = None
    baseline_last_batch: int | None = None
    baseline_calm_at: str | None = None
    baseline_missing_windows: int | None = None  # Baseline.missing_streak
    bars: tuple[VerificationBar, ...] | None = None
    seen_until: str | None = None
    pods: str | None = None
    change_requests_per_minute: int | None = None
    change_prompt_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class CanaryStatus:
    """``status.autotune.canary``: the canary retune running now (one pod at the new limit beside the others,
    autotune/canary.py), and how the last one ended."""

    phase: Literal["Running", "Promoting"] | None = None
    from_batch_size: int | None = None
    to_batch_size: int | None = None
    reason: str | None = None
    started_at: str | None = None
    spare: bool | None = None
    ready_at: str | None = None
    pod: str | None = None
    canary: VerificationSide | None = None
    others: VerificationSide | None = None
    in_force_at: str | None = None
    last_batch: int | None = None
    calm_at: str | None = None
    worse_windows: int | None = None  # as VerificationWatch.worse_windows
    seen_until: str | None = None
    pods: str | None = None
    outcome: Literal["Promoted", "RolledBack", "Abandoned"] | None = None
    message: str | None = None
    decided_at: str | None = None


@dataclasses.dataclass(frozen=True)
class AutotuneStatus:
    """``status.autotune``: what the tuner recommends and what it did."""

    recommendation: DecisionRecord | None = None
    last_applied_at: str | None = None
    ceiling_request: int | None = None
    ceiling_request_from: int | None = None
    history: tuple[DecisionRecord, ...] | None = None
    what_if_declined_at: str | None = None
    model: ModelStatus | None = None
    verification: VerificationStatus | None = None
    canary: CanaryStatus | None = None


@dataclasses.dataclass(frozen=True)
class GroupRecreation:
    """``status.groups.lastRecreation``."""

    group: int | None = None
    at: str | None = None
    message: str | None = None


@dataclasses.dataclass(frozen=True)
class GroupsStatus:
    """``status.groups``: a multi-node engine's LeaderWorkerSet groups (desired/groups.py)."""

    replicas: int | None = None
    ready: int | None = None
    pods_per_group: int | None = None
    ready_pods: int | None = None
    summary: str | None = None
    leaders: tuple[str, ...] | None = None
    last_recreation: GroupRecreation | None = None


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """The whole ``status``. Absent sections are None (an empty section is an instance with no fields set)."""

    observed_generation: int | None = None
    conditions: tuple[ConditionRecord, ...] | None = None
    engine: EngineInfo | None = None
    build: BuildStatus | None = None
    batching: BatchingStatus | None = None
    kv_cache: KvCacheStatus | None = None
    autotune: AutotuneStatus | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    groups: GroupsStatus | None = None
    selector: str | None = None
    endpoint: str | None = None

    def condition(self, type_: str) -> ConditionRecord | None:
        """The condition of this type, if status has one."""
        return next((c for c in self.conditions or () if c.type == type_), None)


def parse_status(raw: object) -> EngineStatus:
    """``status`` as stored -> EngineStatus. Never raises: what does not fit the schema reads as absent."""
    parsed = record(EngineStatus, raw)
    return parsed if isinstance(parsed, EngineStatus) else EngineStatus()


def status_dict(status: EngineStatus) -> dict[str, Any]:
    """EngineStatus -> the camelCase dict written to the API server (absent fields are left out)."""
    return to_wire(status)
