"""A climb whose last step was measured and kept does not wait out the cooldown while most requests still miss TTFT.

The cooldown stops flapping; a raise after a raise is none. Measured on the suite (long-output-a100 decoding 30% off
its profile, from 64): 64 -> 117, then 28-31% of requests late for the whole 10-minute cooldown before 117 -> 234;
with the step taken once 117 had a settled minute, 22.66 good req/s against 22.37 (the oracle: 23.29 at 256).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from kvpilot.autotune.inputs import AppliedChange
from kvpilot.autotune.policy import decide
from kvpilot.autotune.verification import Memory, watch
from tests.unit.test_autotune_mild_break import settled
from tests.unit.test_autotune_rollback import NOW, inp, kv

# The batch is full at 512 with a queue, 30% of requests miss TTFT, TPOT has room: the rules raise.
LATE = replace(kv(active=512, tpot=30.0, queued=20.0), ttft_miss_fraction=0.30, peak_queued=40, ttft_p95_ms=3500.0)
RAISED = (AppliedChange(NOW - timedelta(seconds=300), 256, 512),)


def test_after_a_measured_raise_the_next_raise_skips_the_cooldown() -> None:
    d = decide(inp(w=LATE, mem=settled(0.70), recent_changes=RAISED))
    assert (d.action, d.reason) == ("Raise", "QueueWithHeadroom") and d.target > 512, d.message


def test_the_cooldown_holds_otherwise() -> None:
    cases = {
        "the pooled misses are few": inp(w=LATE, mem=settled(0.90), recent_changes=RAISED),
        "the last change was a lower": inp(w=LATE, mem=settled(0.70),
                                           recent_changes=(AppliedChange(NOW - timedelta(seconds=300), 600, 512),)),
        "nothing measured at 512": inp(w=LATE, mem=Memory(), recent_changes=RAISED),
    }
    for name, tuner in cases.items():
        d = decide(tuner)
        assert (d.action, d.reason) == ("Hold", "Cooldown"), f"{name}: {d.message}"
    # Few misses in the window: no step is worth a restart, waiver or not.
    d = decide(inp(w=replace(LATE, ttft_miss_fraction=0.19), mem=settled(0.70), recent_changes=RAISED))
    assert d.action == "Hold", d.message


def test_a_raise_still_under_verification_is_waited_for() -> None:
    mem = settled(0.70)
    pending = replace(mem, watch=watch(settled(0.60, limit=256).baseline, 256, 512, NOW.timestamp() - 30.0))
    d = decide(inp(w=LATE, mem=pending, recent_changes=RAISED))
    assert d.action == "Hold" and d.reason in ("Cooldown", "AwaitingVerification"), d.message
