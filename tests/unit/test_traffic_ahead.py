"""The traffic ahead of a shift (autotune/ahead.py): a TPOT lower the pods call for while the mix moves is ranked
on the mean prompt carried on in the direction it moved, until the model shows the break the pods show.

Measured on chat then document Q&A without a spare GPU (docs/tuner-suite.md, "Thirteenth pass"): the window 30 s
after documents arrived read 703-token prompts where documents average 2,000, the model saw no break at 256 and
the lower stopped at 143, where the pods served nothing in time. The windows here are that one's figures."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from kvpilot.autotune.ahead import REPRODUCED, traffic_ahead
from kvpilot.autotune.gate import WhatIfGate, model_misses
from kvpilot.autotune.inputs import TunerHistory
from kvpilot.autotune.policy import decide
from kvpilot.autotune.shift import SeenTraffic
from kvpilot.autotune.window import KvWindow
from kvpilot.autotune.whatif import WhatIf
from tests.unit.test_autotune_rollback import MODEL, inp, kv

NO_SURGE = replace(MODEL, surge=False)
CHAT = SeenTraffic(rate_per_pod=15.0, prompt_mean=294.0, output_mean=492.0, age_s=15.0, requests=450.0)


def mid_shift(prompt: float = 703.0, output: float = 453.0, tpot_misses: float = 0.62) -> KvWindow:
    """The window 30 s after documents arrived: 4 req/s per pod, chat's long outputs still finishing, p95 TPOT
    96 ms against 60 ms at 256."""
    return replace(kv(active=250, tpot=96.0, tpot_misses=tpot_misses), runtime_batch_size=256, peak_active=250,
                   arrival_rate=4.0, completion_rate=10.0, prompt_mean=prompt, output_mean=output)


def test_the_lengths_are_carried_on_until_the_model_shows_the_pods_break() -> None:
    w = mid_shift()
    assert (model_misses(NO_SURGE, w, 256) or 0.0) < REPRODUCED * w.miss_share  # blind on the window's lengths
    ahead = traffic_ahead(NO_SURGE, CHAT, w, w, 256)
    assert ahead is not None
    traffic, note = ahead
    assert traffic.prompt_mean > w.prompt_mean  # the way the prompts moved
    assert traffic.output_mean == w.output_mean  # outputs of the finished requests read short while pods fill
    assert traffic.prompt_mean <= w.prompt_mean * (w.prompt_mean / CHAT.prompt_mean) ** 2  # at most twice the move
    shown = model_misses(NO_SURGE, traffic, 256)
    assert shown is not None and shown >= REPRODUCED * w.miss_share
    assert "the mix is moving (prompts 294 -> 703" in note and "the candidates are ranked there" in note


@pytest.mark.parametrize("before", [
    None,  # no record of the last window
    replace(CHAT, prompt_mean=690.0, output_mean=460.0, rate_per_pod=4.0),  # the same mix: not moving
])
def test_a_mix_that_is_not_moving_is_read_as_it_is(before: SeenTraffic | None) -> None:
    assert traffic_ahead(NO_SURGE, before, mid_shift(), mid_shift(), 256) is None


def test_a_model_that_sees_the_break_already_keeps_the_window_s_lengths() -> None:
    documents = mid_shift(prompt=2000.0, output=300.0)  # the lengths have arrived: the model misses at 256
    assert traffic_ahead(NO_SURGE, replace(CHAT, prompt_mean=900.0), documents, documents, 256) is None


def test_a_break_the_lengths_cannot_explain_keeps_the_window_s_lengths() -> None:
    """Prompts that got shorter and outputs barely moved: carried on, the model still serves all in time."""
    lighter = mid_shift(prompt=100.0, output=480.0, tpot_misses=0.9)
    assert traffic_ahead(NO_SURGE, replace(CHAT, prompt_mean=400.0), lighter, lighter, 256) is None


def test_a_tpot_lower_mid_shift_is_ranked_on_the_traffic_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpilot.autotune.policy as policy

    seen: list[KvWindow] = []
    ranked_ahead: list[object] = []

    def verdict(_model: object, traffic: KvWindow, *_a: object, **k: object) -> WhatIf:
        seen.append(traffic)
        ranked_ahead.append(k.get("ahead"))
        return WhatIf(51, "goodput 4.27 staying at 256; 7.09 at 51")

    monkeypatch.setattr(policy, "what_if_verdict", verdict)
    base = inp(current=256, w=mid_shift(), what_if=WhatIfGate(model=NO_SURGE), last_applied_at=None)
    d = decide(replace(base, history=replace(base.history, last_traffic=CHAT)))
    # No settled minutes weigh the break yet: it waits a window (most requests miss: one), keeping chat's record.
    assert (d.action, d.reason, d.keeps_traffic) == ("Hold", "TrafficShifting", True) and not seen, d.message
    waited = replace(base.history, last_traffic=CHAT, shifting_since=base.now - timedelta(seconds=15))
    d = decide(replace(base, history=waited))
    assert d.action == "Lower" and d.target == 51 and "the mix is moving" in d.message, d.message
    assert seen and seen[-1].prompt_mean > 703.0
    assert ranked_ahead[-1] is True  # the choice knows its traffic is carried ahead (robust.off_the_edge)
    # without a record of the last window the window's own lengths are replayed, as before
    seen.clear()
    d = decide(replace(base, history=TunerHistory(last_applied_at=None)))
    assert d.action == "Lower" and "the mix is moving" not in d.message, d.message
    assert seen and seen[-1].prompt_mean == pytest.approx(703.0)
    assert ranked_ahead[-1] is False
