"""The runtime batch size in force: provenance survives a ceiling clamp; jittering advice is not news."""

from __future__ import annotations

from datetime import datetime, timezone

from kvpilot.api.status import AutotuneStatus, BatchingSource, BatchingStatus
from kvpilot.autotune.decision import Decision
from kvpilot.desired.batching import autotune_status, batching_status, value_in_force
from tests.unit.helpers import spec_of, manifest

NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)
AUTO = spec_of(manifest(autotune={"mode": "Auto"}))


def test_a_tuned_value_clamped_to_a_lower_ceiling_stays_tuned() -> None:
    tuned = batching_status(AUTO, BatchingStatus(), value=400, reason="AutotuneRaised", message="raised", ceiling=512,
                            now=NOW)
    value, reason, _ = value_in_force(AUTO, tuned, 256)  # the engine in service now has a 256 ceiling
    clamped = batching_status(AUTO, tuned, value=value, reason=reason, message="", ceiling=256, now=NOW)
    assert (value, reason, clamped.source) == (256, "EngineCeiling", BatchingSource.AUTOTUNE)
    again, _, _ = value_in_force(AUTO, clamped, 256)
    assert again == 256  # not back to the spec's 64


def test_a_new_spec_value_resets_the_tuner() -> None:
    tuned = batching_status(AUTO, BatchingStatus(), value=400, reason="AutotuneRaised", message="raised", ceiling=512,
                            now=NOW)
    changed = spec_of(manifest(autotune={"mode": "Auto"}, batching__maxBatchSize=32))
    assert value_in_force(changed, tuned, 512)[:2] == (32, "SpecValue")


def test_advice_whose_target_only_jitters_is_not_recorded_again() -> None:
    def advise(previous: AutotuneStatus, target: int) -> AutotuneStatus:
        return autotune_status(previous, Decision("Raise", target, "QueueWithHeadroom", "m"), current=64,
                               applied=False, now=NOW)

    first = advise(AutotuneStatus(), 106)
    jitter, moved = advise(first, 119), advise(first, 200)
    assert jitter == first
    assert moved.recommendation is not None and moved.recommendation.to_batch_size == 200
    assert len(moved.history or ()) == 2


def test_a_hand_edited_tuned_value_without_a_reason_still_reads_as_tuned() -> None:
    edited = BatchingStatus(max_batch_size=100, source=BatchingSource.AUTOTUNE, spec_value=64)
    assert value_in_force(AUTO, edited, 512) == (100, "AutotuneRaised", "")
