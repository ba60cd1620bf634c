"""Release surfaces (trtllm/options/releases.yaml): golden renders per release, every rendered key accepted by
that release, the release read from the image tag or the build Job's record, and a mismatch as a condition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kvpilot.api.status import status_dict
from kvpilot.cli import load_engines, render
from kvpilot.desired.contract import release_condition
from kvpilot.desired.settings import Settings
from kvpilot.trtllm import surface as S
from kvpilot.trtllm.serve import llm_api_options, rejected_keys, serving_surface
from tests.unit.helpers import engine

ROOT = Path(__file__).parents[2]
GOLDEN = ROOT / "tests" / "golden" / "releases"
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"
# One image tag per release line in the table, and one the table does not know.
TAGS = {"1.2.0": "1.2.0", "1.2.1": "1.2.1", "1.3": "1.3.0", S.CONSERVATIVE: "latest"}
EXAMPLES = ("llama-3.1-8b-fp8-h100", "pytorch-backend")


def _render(example: str, tag: str, tmp_path: Path) -> str:
    text = (ROOT / "examples" / f"{example}.yaml").read_text().replace(f"{IMAGE}:1.2.0", f"{IMAGE}:{tag}")
    path = tmp_path / f"{example}.yaml"
    path.write_text(text)
    return render(load_engines(str(path)), Settings(kvsim_image="ghcr.io/kvpilot/kvsim:0.1.0",
                                                    default_image=f"{IMAGE}:{tag}"), True)


@pytest.mark.parametrize("release", list(TAGS))
@pytest.mark.parametrize("example", EXAMPLES)
def test_golden_render_per_release(release: str, example: str, tmp_path: Path) -> None:
    out = _render(example, TAGS[release], tmp_path)
    golden = GOLDEN / release / f"{example}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out)
    assert out == golden.read_text()


def _llm_api(rendered: str) -> dict:
    (cm,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"
             and "llm-api.yaml" in d.get("data", {})]
    return yaml.safe_load(cm["data"]["llm-api.yaml"])


@pytest.mark.parametrize("release", list(TAGS))
def test_return_perf_metrics_only_where_trtllmargs_has_the_field(release: str, tmp_path: Path) -> None:
    trt = _llm_api(_render("llama-3.1-8b-fp8-h100", TAGS[release], tmp_path))
    torch = _llm_api(_render("pytorch-backend", TAGS[release], tmp_path))
    # NVIDIA/TensorRT-LLM#9678: 1.2's TrtLlmArgs lacks perf_metrics_max_requests -> AttributeError at startup.
    assert ("return_perf_metrics" in trt) is (release == "1.3")
    assert torch["return_perf_metrics"] is True and torch["enable_iter_perf_stats"] is True
    assert "enable_iter_perf_stats" not in trt


@pytest.mark.parametrize("release", [*S.releases(), S.CONSERVATIVE])
@pytest.mark.parametrize("backend", ["tensorrt", "pytorch", "simulated"])
def test_every_rendered_key_is_accepted_by_the_release(release: str, backend: str) -> None:
    surface = S.get(release)
    for overrides in ({}, {"batching": {"mode": "static"}}, {"build": {"kvCacheDtype": "fp8"}}):
        e = engine(backend, **overrides)  # type: ignore[arg-type]
        options = llm_api_options(e.spec, None, 8, surface)
        name = "pytorch" if backend == "pytorch" else "tensorrt"
        assert rejected_keys(options, surface, name) == []


def test_a_key_a_release_rejects_is_caught_by_the_check() -> None:
    one_two = S.get("1.2.0")
    assert rejected_keys({"return_perf_metrics": True, "perf_metrics_max_requests": 5}, one_two, "tensorrt") == \
        ["perf_metrics_max_requests"]
    assert rejected_keys({"scheduler_config": {"waiting_queue_policy": "FCFS"}}, one_two, "tensorrt") == \
        ["scheduler_config.waiting_queue_policy"]
    assert rejected_keys({"scheduler_config": {"waiting_queue_policy": "FCFS"}}, S.get("1.3"), "tensorrt") == []
    assert rejected_keys({"enable_iter_perf_stats": True}, S.get("1.3"), "tensorrt") == ["enable_iter_perf_stats"]


@pytest.mark.parametrize("image, release", [
    (f"{IMAGE}:1.2.0", "1.2.0"), (f"{IMAGE}:1.2.0rc2", "1.2.0"), (f"{IMAGE}:1.2.1", "1.2.1"),
    (f"{IMAGE}:1.3.0rc3", S.CONSERVATIVE), (f"{IMAGE}:1.3.0rc5", "1.3"), (f"{IMAGE}:1.3.1", "1.3"),
    (f"{IMAGE}:1.4.0", S.CONSERVATIVE), (f"{IMAGE}:latest", S.CONSERVATIVE), (IMAGE, S.CONSERVATIVE),
    (f"{IMAGE}@sha256:{'a' * 64}", S.CONSERVATIVE), ("registry.local:5000/trtllm", S.CONSERVATIVE),
    ("registry.local:5000/trtllm:1.2.1-custom", "1.2.1"),
])
def test_release_from_the_image_tag(image: str, release: str) -> None:
    assert S.release_of_image(image) == release


def test_unknown_release_is_the_most_conservative_surface() -> None:
    c = S.get(S.CONSERVATIVE)
    assert not c.trt_has_perf_metrics_max_requests and c.runtime_limit_above_engine == "reject"
    for release in S.releases():
        assert c.scheduler_config_keys <= S.get(release).scheduler_config_keys
        assert S.get(release).pytorch_only_keys - {"perf_metrics_max_requests"} <= c.pytorch_only_keys


def test_the_recorded_surface_wins_and_a_mismatch_is_a_condition_not_a_crash() -> None:
    image = f"{IMAGE}:1.2.0"
    surface, message = S.effective(image, {"version": "1.3.0", "trtLlmArgsHasPerfMetricsMaxRequests": True})
    assert surface.release == "1.3" and surface.trt_has_perf_metrics_max_requests
    assert message and "tagged as TensorRT-LLM release 1.2.0" in message and "1.3.0" in message
    cond = release_condition(image, surface, "recorded", message)
    assert (cond.type, cond.status, cond.reason) == ("ReleaseContract", "False", "ReleaseMismatch")
    # A patched 1.2 image whose TrtLlmArgs gained the field: the fact overrides the row.
    patched, note = S.effective(image, {"version": "1.2.0", "trtLlmArgsHasPerfMetricsMaxRequests": True})
    assert patched.release == "1.2.0" and patched.renders_return_perf_metrics("tensorrt") and note
    # Matching record: no message; garbage record: ignored, the tag decides.
    assert S.effective(image, {"version": "1.2.0", "trtLlmArgsHasPerfMetricsMaxRequests": False})[1] is None
    assert S.effective(image, {"version": 5})[0].release == "1.2.0"
    assert S.effective(image, "not a dict")[0].release == "1.2.0"  # type: ignore[arg-type]


def test_simulated_backend_renders_for_the_release_kvsim_plays() -> None:
    default = engine("simulated")
    assert serving_surface(default.spec, "ghcr.io/kvpilot/kvsim:0.1.0", None)[0].release == "1.2.0"
    named = engine("simulated", runtime__env=[{"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3"}])
    surface, how, _ = serving_surface(named.spec, "ghcr.io/kvpilot/kvsim:0.1.0", None)
    assert (surface.release, how) == ("1.3", "kvsim")
    assert "return_perf_metrics" in llm_api_options(named.spec, None, 8, surface)
    assert "return_perf_metrics" not in llm_api_options(default.spec, None, 8, S.get("1.2.0"))


def test_every_row_cites_sources() -> None:
    for release in S.releases():
        assert S.get(release).sources and all(len(s) > 20 for s in S.get(release).sources)


@pytest.mark.parametrize("release", S.releases())
def test_kvsim_plays_each_release_as_the_operator_table_describes_it(release: str) -> None:
    from kvsim.trtllm.releases import resolve as kvsim_release

    played, surface = kvsim_release(release), S.get(release)
    assert played.trt_has_perf_metrics_max_requests is surface.trt_has_perf_metrics_max_requests
    assert played.waiting_queue_policy is ("waiting_queue_policy" in surface.scheduler_config_keys)
    assert played.clamps_runtime_limits is (surface.runtime_limit_above_engine == "clamp")
    assert {played.prometheus_prefix + "time_to_first_token_seconds"} == {surface.prometheus_names["ttft"]}
    assert played.iteration_gauges is bool(surface.prometheus_gauges)
    # The operator assumes for kvsim what kvsim plays by default.
    from kvpilot.trtllm.serve import KVSIM_DEFAULT_RELEASE
    assert kvsim_release(None).name == S.release_of_version(KVSIM_DEFAULT_RELEASE)


def test_plan_serves_from_the_surface_the_build_job_recorded() -> None:
    """A 1.2.0-tagged image whose build Job recorded a 1.3 TensorRT-LLM: rendered for 1.3, reported, no crash."""
    from datetime import datetime, timezone

    from kvpilot.desired.observed import Observed
    from kvpilot.desired.plan import plan

    now = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    settings = Settings(default_image=f"{IMAGE}:1.2.0")
    e = engine("tensorrt")
    first = plan(e, Observed(claim_phase="Bound"), settings, now)
    assert first.index_entry is None and first.build_job is not None

    def served(record: dict | None) -> tuple[dict, dict]:
        manifest = {"fingerprint": first.fingerprint, "maxBatchSize": 64, "image": f"{IMAGE}:1.2.0",
                    **({"trtllm": record} if record is not None else {})}
        p = plan(e, Observed(claim_phase="Bound", engine_index={first.fingerprint: manifest}), settings, now)
        (cm,) = [o for o in p.apply if o["kind"] == "ConfigMap"]
        cond = {c["type"]: c for c in status_dict(p.status)["conditions"]}["ReleaseContract"]
        return yaml.safe_load(cm["data"]["llm-api.yaml"]), cond

    options, cond = served(None)  # nothing recorded: the tag decides
    assert "return_perf_metrics" not in options and (cond["status"], cond["reason"]) == ("True", "Matches")
    options, cond = served({"version": "1.3.0", "trtLlmArgsHasPerfMetricsMaxRequests": True})
    assert options["return_perf_metrics"] is True
    assert (cond["status"], cond["reason"]) == ("False", "ReleaseMismatch") and "1.3.0" in cond["message"]
    options, cond = served({"version": "1.2.0", "trtLlmArgsHasPerfMetricsMaxRequests": False})
    assert "return_perf_metrics" not in options and cond["reason"] == "Matches"
    assert "recorded by the build Job" in cond["message"]
    _, cond = served({"probeError": "tensorrt_llm: No module named 'tensorrt_llm'"})  # the tag decides
    assert cond["reason"] == "Matches" and "as its tag names" in cond["message"]


def test_a_hostile_record_is_cut_to_what_status_may_hold() -> None:
    from kvpilot.api.status_schema import _engine
    from kvpilot.api.validate import validate_value

    record = {"version": "1.2.0" + "x" * 1000, "trtLlmArgsHasPerfMetricsMaxRequests": "yes",
              "collectorNames": ["n" * 500] * 100 + [5], "collectorPrefix": ["x"], "evil": {"a": 1}}
    clean = S.clean_record(record)
    assert clean is not None and set(clean) == {"version", "collectorNames"}
    assert validate_value(_engine()["properties"]["trtllm"], clean, "status.engine.trtllm") == []
    assert S.clean_record("x") is None and S.clean_record({"evil": 1}) is None
