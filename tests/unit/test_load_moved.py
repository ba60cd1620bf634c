"""A load that moved and stayed moved (autotune/rollback.load_moved): the baseline at the limit in force, or the
traffic the last pass recorded, witnesses it beside this window. The record is kept across a rollout, whose mixed
limits no baseline counts (docs/tuner-suite.md, "Eleventh pass")."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from kvpilot.api.status import Action
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.inputs import TunerInput
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.rollback import MOVED_RECORD_SECONDS, load_moved, verified_first
from kvpilot.autotune.shift import SeenTraffic
from kvpilot.autotune.verification import Baseline, Memory, watch
from kvpilot.autotune.window import KvWindow
from tests.unit.test_autotune_rollback import NOW, figures, inp, kv

DOCUMENTS = (8.0, 2000.0)  # offered req/s over both pods, mean prompt: the load the change was made at
CHAT = kv(active=42, tpot=30.0)  # 15 req/s a pod, prompts of 150 tokens


def chat_record(age_s: float | None, rate_per_pod: float = 15.0, prompt: float = 150.0) -> SeenTraffic:
    return SeenTraffic(rate_per_pod, prompt, 600.0, age_s, 200.0)


def seen(record: SeenTraffic | None, w: KvWindow = CHAT) -> TunerInput:
    """The pass right after the rollout of 28 -> 42, with ``record`` as the last pass's traffic."""
    base = inp(current=42, w=w, mem=just_rolled_out(), last_applied_at=NOW - timedelta(seconds=150))
    return replace(base, history=replace(base.history, last_traffic=record))


def just_rolled_out() -> Memory:
    """A raise 28 -> 42 made at the document load, rolled out: the baseline at 42 has no window yet."""
    base = Baseline()
    for k in range(8):
        base = base.observe(replace(figures(NOW.timestamp() - 400.0 + 15.0 * k, 28, 0.9), offered=120.0,
                                    prompt_mean=2000.0), 28)
    return Memory(baseline=Baseline(42), watch=watch(base, 28, 42, NOW.timestamp() - 150.0))


@pytest.mark.parametrize("age", [15.0, 75.0, MOVED_RECORD_SECONDS])
def test_a_recent_record_at_the_new_load_witnesses_the_move(age: float) -> None:
    assert load_moved(seen(chat_record(age)), CHAT, DOCUMENTS)


@pytest.mark.parametrize("record", [None, chat_record(None), chat_record(MOVED_RECORD_SECONDS + 15.0),
                                    chat_record(0.0), chat_record(5.0),
                                    chat_record(15.0, rate_per_pod=4.0, prompt=2000.0),
                                    chat_record(15.0, rate_per_pod=7.5), chat_record(15.0, rate_per_pod=1.0,
                                                                                      prompt=100.0)],
                         ids=["none", "age-unknown", "stale", "same-pass", "overlapping", "record-at-the-old-load",
                              "record-at-another-pod-count", "record-moved-the-other-way"])
def test_one_window_alone_is_no_move(record: SeenTraffic | None) -> None:
    """Without a second witness (no record, an unusable one, one that shares this window's samples, one at the
    load of the change, or one that disagrees with this window: written at another pod count, where its rate per
    pod reads as half the load, or moved the other way), one window at a new load may be noise."""
    assert not load_moved(seen(record), CHAT, DOCUMENTS)


def test_a_window_back_at_the_old_load_is_no_move_whatever_the_record_says() -> None:
    back = replace(CHAT, arrival_rate=4.0, prompt_mean=2000.0)
    assert not load_moved(seen(chat_record(15.0), back), back, DOCUMENTS)


def test_the_raise_a_new_load_calls_for_waits_for_no_verdict_of_a_change_made_at_the_old_one() -> None:
    """The raise chat calls for, right after a raise for the document load rolled out: with the record at chat's
    load it goes ahead; without one it waits for the verdict (one step at a time)."""
    raise_ = Decision(Action.RAISE, 74, TunerReason.QUEUE_WITH_HEADROOM, "41% of requests miss the TTFT objective")
    missing = replace(CHAT, ttft_miss_fraction=0.41)
    assert verified_first(seen(chat_record(75.0), missing), missing, raise_) == raise_
    assert verified_first(seen(None, missing), missing, raise_).reason == "AwaitingVerification"
