"""What is measured overrules what is predicted (issue 18): the rollback rule, the bars it leaves, and the what-if
that may not veto a protective change. Policy-level table tests (autotune/rollback.py, autotune/policy.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from kvpilot.api.models import AutotuneSpec, MetricsSpec, SloSpec
from kvpilot.autotune.gate import WhatIfGate
from kvpilot.autotune.inputs import AppliedChange, ChangeCost, TunerHistory, TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.verification import Baseline, Memory, watch
from kvpilot.autotune.bars import Bar
from kvpilot.autotune.verify import WindowFigures
from kvpilot.autotune.whatif import Decline, Engine, WhatIf
from kvpilot.autotune.window import KvWindow

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SPEC = AutotuneSpec(enabled=True, mode="Auto", min_batch_size=8, max_batch_size=1024,
                    target_kv_cache_utilization_percent=85, interval_seconds=15, cooldown_seconds=600,
                    warmup_seconds=60, allow_rebuild=False, metrics=MetricsSpec("Pod"), slo=SloSpec(3000, 60))
MODEL = Engine(profile="llama-3.1-8b-bf16-a100", ceiling=1024, scheduler_policy="GuaranteedNoEvict", replicas=2,
               restart_seconds=90.0, surge=True, ttft_ms=3000.0, tpot_ms=60.0)


def kv(active: int = 400, tpot: float | None = 40.0, tpot_misses: float = 0.0, queued: float = 0.0) -> KvWindow:
    return KvWindow(samples=10, pods=2, peak_utilization=0.5, mean_utilization=0.5, peak_used_blocks=7000,
                    max_blocks=14000, tokens_per_block=32, peak_active=active, mean_active=active, peak_queued=0,
                    mean_queued=queued, paused=0, runtime_batch_size=512, tpot_p95_ms=tpot,
                    tpot_miss_fraction=tpot_misses, ttft_miss_fraction=0.0, window_seconds=15.0,
                    arrival_rate=15.0, prompt_mean=150.0, output_mean=600.0, completion_rate=15.0)


def figures(end: float, limit: int, share: float) -> WindowFigures:
    return WindowFigures(end, 15.0, limit, 2, 2, 450.0, 450.0, 450.0 * share, 450.0, 400.0, 10.0, 150.0, 600.0)


def memory(after_share: float, now_s: float) -> Memory:
    """A raise 64 -> 512 at now - 300 s, verified at 512 until now with the given share served in time."""
    at = now_s - 300.0
    base = Baseline()
    for k in range(8):
        base = base.observe(figures(at - 105.0 + 15.0 * k, 64, 0.56), 64)
    w = watch(base, 64, 512, at)
    t = at + 90.0
    while t <= now_s:
        w = w.observe(figures(t, 512, after_share))
        t += 15.0
    return Memory(baseline=base, watch=w)


def inp(current: int = 512, w: KvWindow | None = None, mem: Memory | None = None, **kw: object) -> TunerInput:
    history = TunerHistory(last_applied_at=kw.pop("last_applied_at", NOW - timedelta(seconds=300)),  # type: ignore[arg-type]
                           recent_changes=kw.pop("recent_changes", ()),  # type: ignore[arg-type]
                           declined_since=kw.pop("declined_since", None),  # type: ignore[arg-type]
                           verification=mem or Memory())
    return TunerInput(current=current, ceiling=1024, spec=SPEC, window=w or kv(), scheduler_policy="GuaranteedNoEvict",
                      now=NOW, expected_pods=2, cost=ChangeCost(replicas=2, restart_seconds=90.0, surge=True),
                      history=history, **kw)  # type: ignore[arg-type]


def test_a_change_that_serves_worse_is_rolled_back_at_once_whatever_the_cooldown_and_the_model_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvpilot.autotune.policy as policy

    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: WhatIf(None, "the model sees no gain", Decline.NO_GAIN))
    d = decide(inp(mem=memory(0.10, NOW.timestamp()), what_if=WhatIfGate(model=MODEL)))
    assert (d.action, d.target, d.reason) == ("Lower", 64, "RolledBack")
    assert "before, at 64" in d.message and "after, at 512" in d.message  # both windows' figures
    kept = decide(inp(mem=memory(0.58, NOW.timestamp())))
    assert kept.reason != "RolledBack"


def test_no_rollback_while_the_value_moved_by_other_means_or_a_rollout_runs() -> None:
    mem = memory(0.10, NOW.timestamp())
    assert decide(inp(current=256, mem=mem)).reason != "RolledBack"  # a user or the spec moved it since
    assert decide(inp(mem=mem, rollout_in_progress=True)).reason == "RolloutInProgress"


def test_the_what_if_cannot_veto_a_protective_lower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18's loss: at 512 on an engine slower than its model, p95 TPOT 62 ms over a 60 ms objective, the
    rules proposed 512 -> 371 on every decision and the nominal model answered "no candidate beats staying
    put" 108 times. Now the lower goes ahead (the simulation may still pick among its candidates)."""
    import kvpilot.autotune.policy as policy

    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: WhatIf(None, "goodput 32.01 staying at 512", Decline.NO_GAIN))
    broken = kv(active=500, tpot=62.0, tpot_misses=0.9)
    d = decide(inp(w=broken, what_if=WhatIfGate(model=MODEL)))
    assert d.action == "Lower" and d.reason == "TpotObjectiveBroken" and d.target < 512, d.message
    assert "cannot veto" in d.message
    declined = decide(inp(w=broken, what_if=WhatIfGate(model=MODEL), declined_since=NOW - timedelta(seconds=30)))
    assert declined.action == "Lower"  # the recheck period does not hold a protective change either
    monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, **_k: WhatIf(None, "no gain", Decline.NO_GAIN))
    raise_ = decide(inp(current=64, w=replace(kv(active=64, tpot=20.0), ttft_miss_fraction=0.4, mean_queued=20.0,
                                              peak_utilization=0.1), what_if=WhatIfGate(model=MODEL),
                    last_applied_at=NOW - timedelta(hours=1)))
    assert raise_.action == "Hold" and raise_.reason == "NoPredictedGain"  # a raise it still may veto
    assert raise_.recheck_later  # a decline that stands: status records it, and the model reruns a period later
    # The policy acts on the verdict's reason, not its wording: a verdict that names none holds (fails closed), and
    # a decline by a young model's error alone holds without the recheck period.
    for decline, stands in ((None, True), (Decline.YOUNG_ERROR, False)):
        monkeypatch.setattr(policy, "what_if_verdict", lambda *_a, _d=decline, **_k: WhatIf(None, "no gain", _d))
        held = decide(inp(current=64, w=replace(kv(active=64, tpot=20.0), ttft_miss_fraction=0.4, mean_queued=20.0,
                                                peak_utilization=0.1), what_if=WhatIfGate(model=MODEL),
                          last_applied_at=NOW - timedelta(hours=1)))
        assert (held.action, held.reason, held.recheck_later) == ("Hold", "NoPredictedGain", stands), held


def test_a_rollback_bars_the_failed_half_of_the_direction() -> None:
    """A raise the rules size into a barred region (here 108, with raises to 100 and beyond barred) goes only to
    just below the bar, or holds when that step is not worth a restart."""
    bar = Bar(True, 100, NOW.timestamp() + 1800)
    pressure = replace(kv(active=64, tpot=20.0), ttft_miss_fraction=0.4, mean_queued=20.0, peak_utilization=0.1)
    d = decide(inp(current=64, w=pressure, mem=Memory(bars=(bar,)), last_applied_at=NOW - timedelta(hours=1)))
    assert d.action == "Raise" and d.target == 99 and "barred" in d.message, d.message
    close = Bar(True, 70, NOW.timestamp() + 1800)
    held = decide(inp(current=64, w=pressure, mem=Memory(bars=(close,)), last_applied_at=NOW - timedelta(hours=1)))
    assert held.action == "Hold" and held.reason == "BarredByVerification"
    over = Bar(True, 100, NOW.timestamp() - 1)  # the horizon is over
    free = decide(inp(current=64, w=pressure, mem=Memory(bars=(over,)), last_applied_at=NOW - timedelta(hours=1)))
    assert free.action == "Raise" and free.target == 108


def test_a_rollback_is_no_oscillation_and_spends_no_reversal() -> None:
    """History 64 -> 512, rolled back 512 -> 64: the pair is left out of the anti-oscillation memory, so the next
    raise (inside the bar) is judged as if neither had happened."""
    from kvpilot.api.status import Action, AutotuneStatus, DecisionRecord, EngineStatus
    from kvpilot.desired.tuning import recent_changes

    def rec(at: int, frm: int, to: int, reason: str) -> DecisionRecord:
        action = Action.RAISE if to > frm else Action.LOWER
        return DecisionRecord(at=f"2026-11-29T11:{at:02d}:00Z", action=action, from_batch_size=frm,
                              to_batch_size=to, reason=reason, applied=True)

    history = (rec(50, 512, 64, "RolledBack"), rec(45, 64, 512, "QueueWithHeadroom"),
               rec(30, 128, 64, "TpotObjectiveBroken"))
    changes = recent_changes(EngineStatus(autotune=AutotuneStatus(history=history)), NOW)
    assert [(c.from_value, c.to_value) for c in changes] == [(128, 64)]
    pressure = replace(kv(active=64, tpot=20.0), ttft_miss_fraction=0.4, mean_queued=20.0, peak_utilization=0.1)
    with_pair = decide(inp(current=64, w=pressure, recent_changes=(
        AppliedChange(NOW - timedelta(minutes=10), 512, 64), AppliedChange(NOW - timedelta(minutes=15), 64, 512),
        AppliedChange(NOW - timedelta(minutes=30), 128, 64)), last_applied_at=NOW - timedelta(minutes=10)))
    assert with_pair.reason == "WouldOscillate"  # counted as changes, the pair would spend the reversal
    without = decide(inp(current=64, w=pressure, recent_changes=changes, last_applied_at=NOW - timedelta(minutes=10)))
    assert without.action == "Raise", without.message


def test_a_bar_holds_only_at_the_load_it_was_measured_at() -> None:
    pressure = replace(kv(active=64, tpot=20.0), ttft_miss_fraction=0.4, mean_queued=20.0, peak_utilization=0.1)
    bar = Bar(True, 100, NOW.timestamp() + 1800, offered_per_s=30.0, prompt_mean=150.0)  # kv(): 2 pods x 15 req/s
    here = decide(inp(current=64, w=pressure, mem=Memory(bars=(bar,)), last_applied_at=NOW - timedelta(hours=1)))
    assert here.target == 99
    busier = replace(pressure, arrival_rate=30.0)  # twice the load: the bar says nothing of it
    there = decide(inp(current=64, w=busier, mem=Memory(bars=(bar,)), last_applied_at=NOW - timedelta(hours=1)))
    assert there.action == "Raise" and there.target > 99


def test_one_step_at_a_time_unless_most_requests_miss() -> None:
    """A second lower waits for the first one's verdict (steps within the noise add up unseen); a severe miss
    waits for nothing."""
    at = NOW.timestamp() - 60
    base = Baseline()
    for k in range(8):
        base = base.observe(figures(at - 105.0 + 15.0 * k, 64, 0.7), 64)
    pending = Memory(baseline=base, watch=watch(base, 64, 57, at))
    mild = kv(active=57, tpot=25.0, tpot_misses=0.2)
    spec = replace(SPEC, slo=SloSpec(3000, 22))
    d = decide(replace(inp(current=57, w=mild, mem=pending, last_applied_at=NOW - timedelta(seconds=60)), spec=spec))
    assert d.action == "Hold" and d.reason == "AwaitingVerification", d.message
    severe = kv(active=57, tpot=40.0, tpot_misses=0.8)
    d = decide(replace(inp(current=57, w=severe, mem=pending, last_applied_at=NOW - timedelta(seconds=60)), spec=spec))
    assert d.action == "Lower", d.message


def test_a_rollback_verdict_the_policy_did_not_act_on_is_reached_again_next_pass() -> None:
    """The verdict says RollBack in a pass where the policy held first (a rollout under way, a thin window): the
    watch stays, so the next pass rolls back; once rolled back, the watch ends and the direction is barred."""
    mem = memory(after_share=0.2, now_s=10_000.0)
    verdict = mem.verdict(10_000.0)
    assert verdict is not None and verdict.outcome == "RollBack"
    held = mem.decided(from_value=512, to_value=512, applied=False, rollback=False, now_s=10_000.0, horizon_s=1800.0)
    assert held.watch is not None and held.last is not None and held.last.outcome == "RollBack"
    done = held.decided(from_value=512, to_value=64, applied=True, rollback=True, now_s=10_015.0, horizon_s=1800.0)
    assert done.watch is None and done.barred(64, 512, 10_015.0) is not None


def test_a_lower_that_served_no_better_bars_further_lowers_at_that_load() -> None:
    at = 10_000.0
    base = Baseline()
    for k in range(8):
        base = base.observe(figures(at - 105.0 + 15.0 * k, 64, 0.7), 64)
    mem = Memory(baseline=base, watch=watch(base, 64, 57, at))
    t = at + 90.0
    while t < at + 420.0:
        mem = mem.observe(figures(t, 57, 0.69), 57, "", t)
        t += 15.0
    done = mem.decided(from_value=57, to_value=57, applied=False, rollback=False, now_s=t, horizon_s=1800.0)
    assert done.watch is None and done.last is not None and done.last.why == "ServesNoWorse"
    assert done.barred(57, 51, t, (30.0, 150.0)) is not None and done.barred(57, 64, t, (30.0, 150.0)) is None


def test_the_reversal_budget_does_not_veto_a_protective_lower_when_most_requests_miss_tpot() -> None:
    """Lowered twice for document Q&A, raised twice for chat: a lower now would be a second reversal within the
    horizon. When most requests miss TPOT the measurements call for it, and the budget (like the what-if) does
    not veto it; a milder TPOT miss is still held."""
    history = (AppliedChange(NOW - timedelta(minutes=3), 57, 456), AppliedChange(NOW - timedelta(minutes=6), 36, 57),
               AppliedChange(NOW - timedelta(minutes=20), 41, 36), AppliedChange(NOW - timedelta(minutes=25), 2048, 41))
    severe = decide(inp(current=456, w=kv(active=450, tpot=90.0, tpot_misses=0.8), recent_changes=history,
                        last_applied_at=NOW - timedelta(minutes=3)))
    assert severe.action == "Lower" and severe.reason == "TpotObjectiveBroken", severe.message
    mild = decide(inp(current=456, w=kv(active=450, tpot=63.0, tpot_misses=0.3), recent_changes=history,
                      last_applied_at=NOW - timedelta(minutes=3)))
    assert mild.action == "Hold" and mild.reason == "WouldOscillate", mild.message


def test_a_change_without_a_baseline_holds_the_next_step_only_until_its_own_value_has_one() -> None:
    at = NOW.timestamp() - 200
    mem = Memory(watch=watch(Baseline(), 64, 57, at))  # made before 64 had a settled baseline
    assert mem.pending(NOW.timestamp()) is not None
    t = at + 15.0
    while t <= NOW.timestamp():
        mem = mem.observe(figures(t, 57, 0.7), 57, "", t)
        t += 15.0
    assert mem.baseline.side.seconds >= 60 and mem.pending(NOW.timestamp()) is None


def test_a_target_a_bar_moved_is_vetted_again_by_the_guarantees() -> None:
    """The limit left 200 for 100 a few minutes ago; a raise past 200 (by a step worth a restart) is allowed with
    evidence, but a raise bar at 210 would move it to 209, back next to 200: an A->B->A the guarantees forbid.
    The bars' move is vetted again, and the result holds instead."""
    from kvpilot.api.status import Action
    from kvpilot.autotune.decision import Decision
    from kvpilot.autotune.guarantees import no_harm
    from kvpilot.autotune.policy import _clear_of_bars
    from kvpilot.autotune.reasons import TunerReason

    bar = Bar(True, 210, NOW.timestamp() + 600.0)
    lowered = (AppliedChange(NOW - timedelta(minutes=5), 200, 100),)
    w = replace(kv(active=100, queued=30.0, tpot=20.0), ttft_miss_fraction=0.6, runtime_batch_size=100)
    state = inp(current=100, w=w, mem=Memory(bars=(bar,)), recent_changes=lowered)
    vetted = no_harm(state, w, Decision(Action.RAISE, 300, TunerReason.QUEUE_WITH_HEADROOM, "queue"))
    assert vetted.target == 300, vetted.message  # past 200 by a step worth a restart: allowed
    d = _clear_of_bars(state, w, vetted)
    assert d.action == "Hold" and d.reason == "BarredByVerification", d.message
    unbarred = _clear_of_bars(inp(current=100, w=w, recent_changes=lowered), w, vetted)
    assert unbarred.target == 300
