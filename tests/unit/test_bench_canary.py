"""The cost of a bad change before it is caught (bench/canary.py): on issue 18's engine (20% slower decode than
its profile) a raise 64 -> 512 is caught and rolled back, by the verification after a full rollout and sooner
in good requests by a canary pod; on the nominal engine the same raise is kept."""

from __future__ import annotations

from kvpilot.bench.canary import evaluate
from kvpilot.bench.cases import case_named


def test_a_bad_raise_is_rolled_back_and_a_canary_costs_less_than_a_full_rollout() -> None:
    out = evaluate(case_named("long-output-a100"), "decode0.8-perseq1.5", 64, 512, 120.0, 540.0, spare_gpu=True)
    runs = {r["mode"]: r for r in out["runs"]}
    assert runs["none"]["verdict"] is None
    assert runs["verify"]["verdict"] == "RollBack" and runs["canary"]["verdict"] == "RollBack"
    assert "before, at 64" in runs["verify"]["message"] and "canary at 512" in runs["canary"]["message"]
    lost = {m: r["lostGoodRequests"] for m, r in runs.items()}
    assert lost["canary"] < lost["verify"] < lost["none"], lost


def test_a_good_raise_is_kept() -> None:
    out = evaluate(case_named("long-output-a100"), "nominal", 64, 512, 120.0, 540.0, spare_gpu=True)
    runs = {r["mode"]: r for r in out["runs"]}
    assert runs["verify"]["verdict"] == "Keep" and runs["canary"]["verdict"] == "Keep"
    assert all(r["lostGoodRequests"] < 0 for r in runs.values())  # every mode gains over static 64
