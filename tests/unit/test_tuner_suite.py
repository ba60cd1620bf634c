"""The suite's shape (issue 8: >= 12 cases, >= 5 profiles, the named coverage) and its done-when criteria."""

from __future__ import annotations

from kvpilot.bench.suite import CASES, Case, criteria

STEADY = Case("x", "llama-3.1-8b-fp8-h100", "", ((600, 1.0),), (100, 80), (100, 80), 256, 2000, 50)


def row(over_start: float, over_oracle: float, hindsight: float, history: list[int]) -> dict:
    return {"ratios": {"overStart": over_start, "overOracle": over_oracle, "hindsightOverOracle": hindsight},
            "autotuned": {"history": [{"to": v} for v in history]}}


def test_the_suite_is_large_and_varied_enough() -> None:
    assert len(CASES) >= 12
    assert len({c.profile for c in CASES}) >= 5
    assert any(c.policy == "MaxUtilization" for c in CASES)
    assert any("-tp2" in c.profile for c in CASES)
    assert any(c.process == "gamma" for c in CASES)
    assert any(len(c.phases) > 1 for c in CASES)
    assert any(c.profile.endswith(("-l4", "-l40s")) for c in CASES)
    assert len({c.name for c in CASES}) == len(CASES)


def test_criteria() -> None:
    assert all(criteria(row(1.0, 1.0, 1.0, []), STEADY).values())
    assert not criteria(row(0.97, 1.0, 1.0, []), STEADY)["neverLose"]
    assert not criteria(row(1.0, 0.96, 1.0, []), STEADY)["nearOracle"]
    assert not criteria(row(1.2, 1.04, 1.2, [128]), STEADY)["winsWhereHindsightDoes"]
    assert criteria(row(1.2, 1.06, 1.2, [128]), STEADY)["winsWhereHindsightDoes"]
    assert not criteria(row(1.0, 1.0, 1.0, [128, 64]), STEADY)["noOscillation"]  # 64 -> 128 -> 64
    assert criteria(row(1.0, 1.0, 1.0, [128, 96]), STEADY)["noOscillation"]
    assert not criteria(row(1.0, 1.0, 1.0, [128, 96, 80]), STEADY)["steadyChanges"]


def test_the_reactive_bound_follows_the_hindsight_schedule_one_evidence_delay_late() -> None:
    from kvpilot.bench.suite import REACT_SECONDS, reactive_changes

    assert reactive_changes([64], []) == []
    assert reactive_changes([512], []) == [(REACT_SECONDS, 512)]
    assert reactive_changes([64, 512], [600.0]) == [(600.0 + REACT_SECONDS, 512)]
    assert reactive_changes([128, 128, 256], [300.0, 600.0]) == [(REACT_SECONDS, 128), (600.0 + REACT_SECONDS, 256)]


def test_phase_best_keeps_the_value_in_force_unless_another_is_clearly_better() -> None:
    from kvpilot.bench.suite import phase_best

    per_phase = {64: [100, 100, 50], 128: [100, 100, 80], 256: [100, 99, 79]}
    assert phase_best(per_phase, 3) == [64, 64, 128]
    assert phase_best({64: [10], 512: [20], 1024: [20]}, 1) == [512]


def test_every_case_runs_thirty_minutes_on_a_cluster_with_a_spare_gpu() -> None:
    from kvpilot.bench.suite import CASE_SECONDS

    assert {c.duration_s for c in CASES} == {CASE_SECONDS}
    assert all(c.spare_gpu for c in CASES)


def test_an_unknown_case_is_named_in_the_error() -> None:
    import pytest

    from kvpilot.bench.suite import run_suite

    with pytest.raises(SystemExit, match="no-such-case"):
        run_suite(False, ["no-such-case"])


def test_the_reactive_bound_acts_one_default_tuning_interval_after_the_evidence() -> None:
    from kvpilot.bench.suite import REACT_SECONDS
    from kvpilot.bench.tuner import Slo, tuned_engine

    e = tuned_engine("llama-3.1-8b-fp8-l40s", 1024, Slo(3000, 60), 64, 2)
    assert REACT_SECONDS == e.spec.autotune.interval_seconds
