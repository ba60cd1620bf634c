"""The operator's Prometheus metrics reflect what a reconcile decided."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import REGISTRY

from kvpilot import telemetry
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from tests.unit.helpers import engine


def test_record_plan_sets_batch_gauges_and_counts_builds() -> None:
    e = engine(name="metrics-test")
    p = plan(e, Observed(claim_phase="Bound"), Settings(), datetime(2026, 11, 29, tzinfo=timezone.utc))
    before = REGISTRY.get_sample_value("kvpilot_reconcile_total", {"result": "ok"}) or 0.0
    telemetry.record_plan(e, p, Observed(), 0.05)
    labels = {"namespace": "ns", "name": "metrics-test", "kind": "runtime"}
    assert REGISTRY.get_sample_value("kvpilot_batch_size", labels) == 64
    assert REGISTRY.get_sample_value("kvpilot_reconcile_total", {"result": "ok"}) == before + 1
    telemetry.forget("ns", "metrics-test")
    assert REGISTRY.get_sample_value("kvpilot_batch_size", labels) is None
