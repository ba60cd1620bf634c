"""Status is parsed into typed models and written back in one place (kvpilot/api/status.py).

Status is user-writable through the status subresource: whatever it holds, parsing must not raise, and what
fits the schema must survive a round trip unchanged.
"""

from __future__ import annotations

import re
import typing
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.api.conditions import ConditionReason
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.api.status import (
    Action,
    BuildState,
    BuildStatus,
    EngineStatus,
    TrtllmRecord,
    parse_record,
    parse_status,
    status_dict,
)
from tests.unit.helpers import engine

WRITTEN = {
    "observedGeneration": 3,
    "conditions": [
        {"type": "EngineReady", "status": "True", "reason": "EngineBuilt", "message": "ok",
         "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ],
    "engine": {"fingerprint": "abc", "maxBatchSize": 64, "tokensPerBlock": 32,
               "trtllm": {"version": "1.0.0", "trtLlmArgsHasPerfMetricsMaxRequests": True,
                          "collectorNames": ["kv_cache_utilization"]}},
    "build": {"fingerprint": "abc", "state": "Succeeded", "job": "build-abc",
              "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:10:00Z"},
    "batching": {"maxBatchSize": 48, "source": "Autotune", "reason": "AutotuneRaised", "summary": "48/64",
                 "specValue": 32},
    "kvCache": {"utilizationPercent": 71, "usedBlocks": 710, "maxBlocks": 1000},
    "autotune": {"recommendation": {"action": "Raise", "fromBatchSize": 32, "toBatchSize": 48, "applied": True},
                 "history": [], "lastAppliedAt": "2026-01-01T00:20:00Z"},
    "replicas": 2,
    "readyReplicas": 1,
    "selector": "a=b",
    "endpoint": "http://x",
}


def test_a_written_status_round_trips_unchanged() -> None:
    parsed = parse_status(WRITTEN)
    assert parsed.build == BuildStatus(fingerprint="abc", job="build-abc", state=BuildState.SUCCEEDED,
                                       started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:10:00Z")
    assert parsed.autotune is not None and parsed.autotune.recommendation is not None
    assert parsed.autotune.recommendation.action is Action.RAISE
    assert parsed.engine is not None and parsed.engine.trtllm == TrtllmRecord(
        version="1.0.0", trt_llm_args_has_perf_metrics_max_requests=True, collector_names=("kv_cache_utilization",))
    assert status_dict(parsed) == WRITTEN


def test_enumerations_are_written_as_plain_strings() -> None:
    out = status_dict(EngineStatus(build=BuildStatus(state=BuildState.CACHE_HIT)))
    assert out == {"build": {"state": "CacheHit"}} and type(out["build"]["state"]) is str


def test_values_that_do_not_fit_read_as_absent() -> None:
    hostile = {
        "observedGeneration": "3",  # a string where an integer belongs
        "conditions": [
            {"type": "Degraded", "status": "Maybe", "reason": "X", "message": "",
             "lastTransitionTime": "t"},  # status outside its enumeration: the record is dropped
            "not a record",
            {"status": "True", "reason": "R", "message": "m", "lastTransitionTime": "t"},  # no type: dropped
            {"type": "Available", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": "t",
             "observedGeneration": True},  # a boolean is not an integer: that field alone is dropped
        ],
        "engine": ["a", "list"],
        "build": {"state": "Exploded", "fingerprint": 7},
        "batching": {"maxBatchSize": 1.5, "source": "Spec"},
        "autotune": {"history": {"not": "a list"}, "ceilingRequest": None},
    }
    parsed = parse_status(hostile)
    assert parsed.observed_generation is None
    assert [c.type for c in parsed.conditions or ()] == ["Available"]
    assert parsed.condition("Available") is not None and parsed.condition("Available").observed_generation is None
    assert parsed.engine is None
    assert parsed.build == BuildStatus()
    assert parsed.batching is not None and parsed.batching.max_batch_size is None
    assert parsed.autotune is not None and parsed.autotune.history is None


def test_a_status_that_is_not_a_mapping_is_empty() -> None:
    for raw in (None, [], "status", 3):
        assert parse_status(raw) == EngineStatus()
    assert parse_record(TrtllmRecord, "x") is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["True", "Building", "Raise", "Autotune", "Failed"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["build", "state", "engine", "conditions", "type", "status", "reason", "message",
                         "lastTransitionTime", "autotune", "history", "action", "maxBatchSize", "trtllm",
                         "collectorNames", "batching", "source", "x"]), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_parsing_any_json_never_raises_and_what_it_keeps_round_trips(raw: object) -> None:
    parsed = parse_status(raw)
    assert parse_status(status_dict(parsed)) == parsed


def test_every_condition_reason_is_pascal_case() -> None:
    reasons = typing.get_args(ConditionReason)
    assert len(set(reasons)) == len(reasons)
    assert [r for r in reasons if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", r)] == []


@pytest.mark.parametrize("backend", ["simulated", "pytorch"])  # pytorch serves at once: the tuner reads the rest
def test_a_plan_over_a_hand_edited_status_neither_raises_nor_keeps_the_remnants(backend: str) -> None:
    """Values of the right types that the operator would never write (each used to raise in plan())."""
    edited = parse_status({
        "engine": {"maxBatchSize": 128},  # no fingerprint: nothing serves from this record
        "batching": {"maxBatchSize": 100, "source": "Autotune", "specValue": 64},  # a tuned value with no reason
        "build": {"state": "Succeeded", "startedAt": "yesterday", "finishedAt": "today"},
        "autotune": {"lastAppliedAt": "not a time",
                     "history": [{"applied": True, "action": "Raise", "at": "soon", "fromBatchSize": 1}]},
    })
    e = engine(backend, autotune={"enabled": True, "mode": "Auto"}, batching__maxBatchSize=64)
    p = plan(e, Observed(status=edited, claim_phase="Bound"), Settings(), datetime(2026, 11, 29, tzinfo=timezone.utc))
    written = p.status
    assert written.engine is None or written.engine.fingerprint is not None
    assert written.batching is not None and written.batching.reason
    assert parse_status(status_dict(written)) == written  # what is written reads back as decided
