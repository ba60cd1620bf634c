"""Workload YAML: validation, determinism, and that generated traffic has the statistics it claims."""

from __future__ import annotations

import itertools
import statistics

import pytest
from kvsim.workload import WorkloadError, bundled_workloads, load_workload, parse_workload

BASE = {"name": "t", "seed": 3, "arrivals": [{"durationSeconds": 2000, "process": "poisson", "ratePerSecond": 10}],
        "inputTokens": {"distribution": "lognormal", "mean": 1155, "median": 1020, "min": 16, "max": 8000},
        "outputTokens": {"distribution": "fixed", "value": 50}, "maxTokens": 64}


def test_bundled_workloads_include_chat_and_code():
    assert {"chat", "code"} <= set(bundled_workloads())


def test_same_seed_same_requests_and_different_seed_differs():
    w = parse_workload(BASE)
    a, b, c = w.requests(), w.requests(), w.requests(seed=4)
    assert [(r.arrival_s, r.prompt_tokens) for r in a] == [(r.arrival_s, r.prompt_tokens) for r in b]
    assert [(r.arrival_s, r.prompt_tokens) for r in a] != [(r.arrival_s, r.prompt_tokens) for r in c]


def test_lognormal_mean_median_and_poisson_rate():
    reqs = parse_workload(BASE).requests()
    prompts = [r.prompt_tokens for r in reqs]
    assert len(reqs) / 2000 == pytest.approx(10, rel=0.05)
    assert statistics.median(prompts) == pytest.approx(1020, rel=0.05)
    assert statistics.mean(prompts) == pytest.approx(1155, rel=0.05)
    assert min(prompts) >= 16 and max(prompts) <= 8000
    assert all(r.output_tokens == 50 and r.max_tokens == 64 for r in reqs)


def test_gamma_cv_and_phase_overrides():
    doc = dict(BASE, arrivals=[
        {"durationSeconds": 1000, "process": "poisson", "ratePerSecond": 5},
        {"durationSeconds": 3000, "process": "gamma", "ratePerSecond": 8, "cv": 3,
         "inputTokens": {"distribution": "uniform", "min": 3000, "max": 4000}}])
    reqs = parse_workload(doc).requests()
    second = [r for r in reqs if r.arrival_s >= 1000]
    assert all(3000 <= r.prompt_tokens <= 4000 for r in second)
    first = [r.prompt_tokens for r in reqs if r.arrival_s < 1000]
    assert statistics.median(first) < 1500  # the workload-level lognormal still applies to phase 1
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(second)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(3, rel=0.2)
    assert len(second) / 3000 == pytest.approx(8, rel=0.2)


def test_duration_repeats_phases_and_rate_scale_scales():
    w = parse_workload(BASE)
    assert len(w.requests(duration_s=4000)) == pytest.approx(40000, rel=0.05)
    assert len(w.requests(rate_scale=0.5)) == pytest.approx(10000, rel=0.05)


def test_empirical_and_shared_prefix():
    doc = dict(BASE, inputTokens={"distribution": "empirical", "values": [100, 900]},
               sharedPrefix={"groups": 2, "tokens": 64, "fraction": 1.0})
    reqs = parse_workload(doc).requests(duration_s=100)
    assert {r.prompt_tokens for r in reqs} == {100, 900}
    assert {r.prefix_id for r in reqs} == {"t-prefix-0", "t-prefix-1"} and all(r.prefix_tokens == 64 for r in reqs)


@pytest.mark.parametrize("patch, message", [
    ({"arrivals": []}, "arrivals"),
    ({"arrivals": [{"durationSeconds": 10, "process": "weibull", "ratePerSecond": 1}]}, "process"),
    ({"inputTokens": {"distribution": "lognormal", "mean": 10, "median": 20}}, "median <= mean"),
    ({"outputTokens": {"distribution": "zipf"}}, "distribution"),
    ({"inputTokens": {"distribution": "fixed"}}, "value"),
    ({"arrivals": ["poisson"]}, r"arrivals\[0\] must be a mapping"),
    ({"arrivals": [{"durationSeconds": "ten", "ratePerSecond": 1}]}, r"arrivals\[0\].durationSeconds must be a finite"),
    ({"arrivals": [{"durationSeconds": 10, "ratePerSecond": True}]}, r"arrivals\[0\].ratePerSecond must be a finite"),
    ({"inputTokens": {"distribution": "lognormal", "mean": "big", "median": 20}}, "inputTokens.mean must be"),
    ({"outputTokens": {"distribution": "empirical", "values": "12"}}, "values must be a list of numbers"),
    ({"outputTokens": {"distribution": "empirical", "values": [1, 2], "weights": [1]}}, "weights must be"),
    ({"sharedPrefix": [8, 512]}, "sharedPrefix must be a mapping"),
    ({"sharedPrefix": {"groups": "eight"}}, "sharedPrefix.groups must be"),
    ({"maxTokens": "2048"}, "maxTokens must be a finite number"),
])
def test_invalid_workloads_name_the_field(patch, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload(dict(BASE, **patch))


@pytest.mark.parametrize("text, message", [
    ("a: [", "is not YAML: .* at line 1, column"),
    ("", "must be a mapping"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("\xff\xfe", None),  # written as bytes below: not UTF-8
])
def test_unreadable_workload_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "w.yaml"
    if message is None:
        path.write_bytes(b"\xff\xfe\x00garbage")
        message = "cannot read the file"
    else:
        path.write_text(text)
    with pytest.raises(WorkloadError, match=message) as raised:
        load_workload(str(path))
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_workload_file_is_named(tmp_path):
    with pytest.raises(WorkloadError, match="absent.yaml: cannot read the file: No such file"):
        load_workload(str(tmp_path / "absent.yaml"))


def test_chat_workload_has_azure_conversation_statistics():
    reqs = load_workload("chat").requests(duration_s=1800)
    assert statistics.median(r.prompt_tokens for r in reqs) == pytest.approx(1020, rel=0.05)
    assert statistics.median(r.output_tokens for r in reqs) == pytest.approx(129, rel=0.08)
    assert len(reqs) / 1800 == pytest.approx(5, rel=0.05)
