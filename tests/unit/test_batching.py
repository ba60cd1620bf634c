"""The runtime batch size in force: provenance survives a ceiling clamp; jittering advice is not news."""

from __future__ import annotations

from datetime import datetime, timezone

from kvpilot.autotune.policy import Decision
from kvpilot.desired.batching import autotune_status, batching_status, value_in_force
from tests.unit.helpers import spec_of, manifest

NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)
AUTO = spec_of(manifest(autotune={"mode": "Auto"}))


def test_a_tuned_value_clamped_to_a_lower_ceiling_stays_tuned() -> None:
    tuned = batching_status(AUTO, {}, 400, "AutotuneRaised", "raised", 512, NOW)
    value, reason, _ = value_in_force(AUTO, tuned, 256)  # the engine in service now has a 256 ceiling
    clamped = batching_status(AUTO, tuned, value, reason, "", 256, NOW)
    assert (value, reason, clamped["source"]) == (256, "EngineCeiling", "Autotune")
    again, _, _ = value_in_force(AUTO, clamped, 256)
    assert again == 256  # not back to the spec's 64


def test_a_new_spec_value_resets_the_tuner() -> None:
    tuned = batching_status(AUTO, {}, 400, "AutotuneRaised", "raised", 512, NOW)
    changed = spec_of(manifest(autotune={"mode": "Auto"}, batching__maxBatchSize=32))
    assert value_in_force(changed, tuned, 512)[:2] == (32, "SpecValue")


def test_advice_whose_target_only_jitters_is_not_recorded_again() -> None:
    first = autotune_status({}, Decision("Raise", 106, "QueueWithHeadroom", "m"), 64, False, NOW)
    jitter = autotune_status(first, Decision("Raise", 119, "QueueWithHeadroom", "m"), 64, False, NOW)
    moved = autotune_status(first, Decision("Raise", 200, "QueueWithHeadroom", "m"), 64, False, NOW)
    assert jitter == first
    assert moved["recommendation"]["toBatchSize"] == 200 and len(moved["history"]) == 2
