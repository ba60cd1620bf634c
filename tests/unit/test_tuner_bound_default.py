"""autotune.maxBatchSize, when absent, is the larger of 1024 and the start: TensorRT-LLM's default start (2048)
is a bound the tuner keeps, not a value it clamps at once with a rolling restart."""

from __future__ import annotations

from dataclasses import replace

from kvpilot.api.crd import spec_openapi
from kvpilot.api.validate import validate_manifest
from kvpilot.autotune.policy import decide
from tests.unit.helpers import manifest, spec_of
from tests.unit.test_autotune_policy import inp, window


def _bound(**overrides: object) -> int:
    return spec_of(manifest(**overrides)).autotune.max_batch_size


def test_an_absent_bound_is_1024_for_a_start_at_or_below_it() -> None:
    assert _bound() == 1024  # the base start, 64
    assert _bound(build__maxBatchSize=1024, batching__maxBatchSize=1024) == 1024


def test_an_absent_bound_follows_a_start_above_1024() -> None:
    assert _bound(build__maxBatchSize=2048, batching__maxBatchSize=2048) == 2048
    assert _bound(backend="pytorch", batching__maxBatchSize=4096) == 4096


def test_an_explicit_bound_is_kept_even_below_the_start() -> None:
    """A bound the user wrote is theirs: the tuner clamps the start into it (OutOfBounds), as before."""
    assert _bound(build__maxBatchSize=2048, batching__maxBatchSize=2048, autotune__maxBatchSize=512) == 512


def test_the_schema_leaves_the_bound_absent_so_the_operator_can_derive_it() -> None:
    out, errors = validate_manifest(manifest(), spec_openapi())
    assert errors == []
    assert "maxBatchSize" not in out["spec"]["autotune"]


def test_a_2048_start_with_no_bound_is_not_clamped_but_an_explicit_1024_is() -> None:
    """What the policy does with each spec at the start: the derived bound holds the start, 1024 clamps it."""
    derived = spec_of(manifest(build__maxBatchSize=2048, batching__maxBatchSize=2048, autotune__mode="Auto"))
    quiet = window(util=0.30, active=40, queued=0)
    kept = decide(inp(current=2048, ceiling=2048, spec=derived.autotune, w=quiet))
    assert kept.reason != "OutOfBounds" and kept.target == 2048
    clamped = decide(inp(current=2048, ceiling=2048, spec=replace(derived.autotune, max_batch_size=1024), w=quiet))
    assert (clamped.reason, clamped.target) == ("OutOfBounds", 1024)
