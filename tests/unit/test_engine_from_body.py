"""engine_from_body: what the operator re-checks when it reads a stored InferenceEngine."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.api.status import parse_status
from kvpilot.api.validate import InvalidEngineError
from kvpilot.reconcile import engine_from_body
from tests.cases.engines import invalid_case


def stored(case: str, generation: int, observed: int | None) -> dict[str, Any]:
    body = invalid_case(case)
    body["metadata"].update({"namespace": "ns", "uid": "u1", "generation": generation})
    if observed is not None:
        body["status"] = {"observedGeneration": observed}
    return body


@pytest.mark.parametrize("observed", [None, 1])
def test_a_new_generation_is_held_to_every_cel_rule(observed: int | None) -> None:
    with pytest.raises(InvalidEngineError, match="build.maxBatchSize"):
        body = stored("batch-above-ceiling", generation=2, observed=observed)
        engine_from_body(body, parse_status(body.get("status")))


def test_a_generation_already_reconciled_is_not_rejudged_by_cel_rules() -> None:
    """Admission enforced the rules for it and this operator reconciled it: a restart (or a stricter newer
    operator) does not stop serving it, as the API server's ratcheting keeps unchanged objects valid."""
    body = stored("batch-above-ceiling", generation=2, observed=2)
    engine = engine_from_body(body, parse_status(body["status"]))
    assert engine.spec.batching.max_batch_size == 1024


def test_types_are_checked_even_for_a_generation_already_reconciled() -> None:
    with pytest.raises(InvalidEngineError, match="integer"):
        body = stored("batch-wrong-type", generation=2, observed=2)
        engine_from_body(body, parse_status(body["status"]))
