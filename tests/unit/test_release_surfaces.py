"""Release surfaces (trtllm/options/releases.yaml): golden renders per release, every rendered key accepted by
that release, the release read from the image tag or the build Job's record, a mismatch as a condition, and a
TensorRT engine refused where the release has no TensorRT backend (1.3.0rc21 and later)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvpilot.api.status import status_dict
from kvpilot.api.validate import InvalidEngineError
from kvpilot.cli import load_engines, render
from kvpilot.desired.contract import release_condition
from kvpilot.desired.settings import Settings
from kvpilot.trtllm import surface as S
from kvpilot.trtllm.serve import llm_api_options, rejected_keys, serving_surface
from tests.unit.helpers import engine

ROOT = Path(__file__).parents[2]
GOLDEN = ROOT / "tests" / "golden" / "releases"
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"
# Golden renders by image tag (tests/golden/releases/<tag>/), with the row each tag maps to: the releases of issue
# 19 (1.2.1 the default, 1.3.0rc20 the last with TensorRT, 1.3.0rc22 and 1.4.0rc1 PyTorch only), 1.2.0, an image
# whose tag names no release (latest) and one newer than every row.
TAGS = {"1.2.0": "1.2.0", "1.2.1": "1.2.1", "1.3.0rc20": "1.3", "1.3.0rc22": "1.3.0rc21", "1.4.0rc1": "1.4",
        "latest": S.CONSERVATIVE, "1.5.0": S.NEWER}
PYTORCH_ONLY = {"1.3.0rc22", "1.4.0rc1", "1.5.0"}
TENSORRT_EXAMPLE, PYTORCH_EXAMPLE = "llama-3.1-8b-fp8-h100", "pytorch-backend"
EXAMPLE_IMAGE = f"{IMAGE}:1.2.1"


def _manifest(example: str, tag: str, tmp_path: Path) -> Path:
    text = (ROOT / "examples" / f"{example}.yaml").read_text()
    assert example == PYTORCH_EXAMPLE or EXAMPLE_IMAGE in text
    path = tmp_path / f"{example}-{tag}.yaml"
    path.write_text(text.replace(EXAMPLE_IMAGE, f"{IMAGE}:{tag}"))
    return path


def _render(example: str, tag: str, tmp_path: Path) -> str:
    return render(load_engines(str(_manifest(example, tag, tmp_path))),
                  Settings(kvsim_image="ghcr.io/kvpilot/kvsim:0.1.0", default_image=f"{IMAGE}:{tag}"), True)


def _golden(path: Path, out: str) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out)
    assert path.exists(), f"no golden {path}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert out == path.read_text()


@pytest.mark.parametrize("tag", list(TAGS))
def test_the_tag_picks_the_row(tag: str) -> None:
    assert S.release_of_image(f"{IMAGE}:{tag}") == TAGS[tag]
    assert S.get(TAGS[tag]).tensorrt_removed is (tag in PYTORCH_ONLY)


@pytest.mark.parametrize("tag", list(TAGS))
def test_golden_pytorch_render_per_release(tag: str, tmp_path: Path) -> None:
    _golden(GOLDEN / tag / f"{PYTORCH_EXAMPLE}.yaml", _render(PYTORCH_EXAMPLE, tag, tmp_path))


@pytest.mark.parametrize("tag", sorted(set(TAGS) - PYTORCH_ONLY))
def test_golden_tensorrt_render_where_the_release_has_the_backend(tag: str, tmp_path: Path) -> None:
    _golden(GOLDEN / tag / f"{TENSORRT_EXAMPLE}.yaml", _render(TENSORRT_EXAMPLE, tag, tmp_path))


@pytest.mark.parametrize("tag", sorted(PYTORCH_ONLY))
def test_tensorrt_on_a_pytorch_only_image_is_refused_offline_naming_the_image(tag: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidEngineError) as refused:
        load_engines(str(_manifest(TENSORRT_EXAMPLE, tag, tmp_path)))
    text = str(refused.value)
    assert "spec.runtime.image" in text and f"{IMAGE}:{tag}" in text and "set runtime.backend: pytorch" in text


def test_kvpilot_render_refuses_it_with_exit_2(tmp_path: Path) -> None:
    path = _manifest(TENSORRT_EXAMPLE, "1.4.0rc1", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kvpilot.cli", "render", "-f", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{IMAGE}:1.4.0rc1 is a TensorRT-LLM release without the TensorRT backend" in proc.stderr
    assert "runtime.backend: pytorch" in proc.stderr


def test_the_operator_refuses_when_only_its_default_image_names_the_release() -> None:
    """No runtime.image (admission cannot tell): the plan creates no Job, says why, and nothing serves."""
    from datetime import datetime, timezone

    from kvpilot.desired.observed import Observed
    from kvpilot.desired.plan import plan

    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    p = plan(engine("tensorrt"), Observed(claim_phase="Bound"), Settings(default_image=f"{IMAGE}:1.4.0rc1"), now)
    assert p.build_job is None and not [o for o in p.apply if o["kind"] == "Deployment"]
    conds = {c["type"]: c for c in status_dict(p.status)["conditions"]}
    contract = conds["ReleaseContract"]
    assert (contract["status"], contract["reason"]) == ("False", "BackendRemoved")
    assert f"image {IMAGE}:1.4.0rc1" in contract["message"] and "set runtime.backend: pytorch" in contract["message"]
    assert conds["EngineReady"]["reason"] == "BuildFailed" and "runtime.backend: pytorch" in conds["EngineReady"][
        "message"]
    again = plan(engine("tensorrt"), Observed(status=p.status, claim_phase="Bound"),
                 Settings(default_image=f"{IMAGE}:1.4.0rc1"), now.replace(hour=13))
    assert again.status.build == p.status.build  # refused once: no status churn on every pass


def _llm_api(rendered: str) -> dict:
    (cm,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"
             and "llm-api.yaml" in d.get("data", {})]
    return yaml.safe_load(cm["data"]["llm-api.yaml"])


@pytest.mark.parametrize("tag", list(TAGS))
def test_return_perf_metrics_only_where_trtllmargs_has_the_field(tag: str, tmp_path: Path) -> None:
    torch = _llm_api(_render(PYTORCH_EXAMPLE, tag, tmp_path))
    assert torch["return_perf_metrics"] is True and torch["enable_iter_perf_stats"] is True
    assert "dynamic_batch_config" not in torch["scheduler_config"]  # TensorRT-only: the in-engine tuner
    assert torch["cuda_graph_config"] == {"max_batch_size": 128, "enable_padding": True}  # the limit in force
    if tag in PYTORCH_ONLY:
        return
    trt = _llm_api(_render(TENSORRT_EXAMPLE, tag, tmp_path))
    # NVIDIA/TensorRT-LLM#9678: 1.2's TrtLlmArgs lacks perf_metrics_max_requests -> AttributeError at startup.
    assert ("return_perf_metrics" in trt) is (TAGS[tag] == "1.3")
    assert "enable_iter_perf_stats" not in trt and "cuda_graph_config" not in trt
    assert "dynamic_batch_config" in trt["scheduler_config"]


# Every release with every backend it runs (TensorRT on a PyTorch-only release is refused before anything renders).
RENDERED = [(r, b) for r in [*S.releases(), S.CONSERVATIVE, S.NEWER]
            for b in ("tensorrt", "pytorch", "simulated", "simulated-pytorch")
            if not (S.get(r).tensorrt_removed and b in ("tensorrt", "simulated"))]


@pytest.mark.parametrize("release, backend", RENDERED)
def test_every_rendered_key_is_accepted_by_the_release(release: str, backend: str) -> None:
    surface = S.get(release)
    for overrides in ({}, {"batching": {"mode": "static"}}, {"build": {"kvCacheDtype": "fp8"}}):
        if backend == "simulated-pytorch":
            e = engine("simulated", runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "backend": "pytorch"},
                       **overrides)  # type: ignore[arg-type]
        else:
            e = engine(backend, **overrides)  # type: ignore[arg-type]
        options = llm_api_options(e.spec, None, 8, surface)
        assert rejected_keys(options, surface, e.spec.trtllm_backend) == []


def test_a_key_a_release_rejects_is_caught_by_the_check() -> None:
    one_two = S.get("1.2.0")
    assert rejected_keys({"return_perf_metrics": True, "perf_metrics_max_requests": 5}, one_two, "tensorrt") == \
        ["perf_metrics_max_requests"]
    assert rejected_keys({"scheduler_config": {"waiting_queue_policy": "FCFS"}}, one_two, "tensorrt") == \
        ["scheduler_config.waiting_queue_policy"]
    assert rejected_keys({"scheduler_config": {"waiting_queue_policy": "FCFS"}}, S.get("1.3"), "tensorrt") == []
    assert rejected_keys({"enable_iter_perf_stats": True}, S.get("1.3"), "tensorrt") == ["enable_iter_perf_stats"]
    assert rejected_keys({"cuda_graph_config": {"max_batch_size": 8, "mode": "decode"}}, S.get("1.4"), "pytorch") == \
        ["cuda_graph_config.mode"]
    assert rejected_keys({"max_batch_size": 8}, S.get("1.4"), "tensorrt") == ["max_batch_size"]  # no such backend


@pytest.mark.parametrize("image, release", [
    (f"{IMAGE}:1.2.0", "1.2.0"), (f"{IMAGE}:1.2.0rc2", "1.2.0"), (f"{IMAGE}:1.2.1", "1.2.1"),
    (f"{IMAGE}:1.2.2", S.CONSERVATIVE), (f"{IMAGE}:1.3.0rc3", S.CONSERVATIVE), (f"{IMAGE}:1.3.0rc5", "1.3"),
    (f"{IMAGE}:1.3.0rc5.post2", "1.3"), (f"{IMAGE}:1.3.0rc20", "1.3"), (f"{IMAGE}:1.3.0rc21", "1.3.0rc21"),
    (f"{IMAGE}:1.3.0rc22.post1", "1.3.0rc21"), (f"{IMAGE}:1.3.0", "1.3.0rc21"), (f"{IMAGE}:1.3.1", "1.3.0rc21"),
    (f"{IMAGE}:1.4.0rc0", "1.4"), (f"{IMAGE}:1.4.0", "1.4"), (f"{IMAGE}:1.4.2", "1.4"), (f"{IMAGE}:1.5.0rc0", S.NEWER),
    (f"{IMAGE}:2.0.0", S.NEWER), (f"{IMAGE}:1.1.0", S.CONSERVATIVE), (f"{IMAGE}:latest", S.CONSERVATIVE),
    (IMAGE, S.CONSERVATIVE), (f"{IMAGE}@sha256:{'a' * 64}", S.CONSERVATIVE),
    ("registry.local:5000/trtllm", S.CONSERVATIVE), ("registry.local:5000/trtllm:1.2.1-custom", "1.2.1"),
])
def test_release_from_the_image_tag(image: str, release: str) -> None:
    assert S.release_of_image(image) == release


def test_unknown_release_is_the_most_conservative_surface() -> None:
    c = S.get(S.CONSERVATIVE)
    assert not c.trt_has_perf_metrics_max_requests and c.runtime_limit_above_engine == "reject"
    assert c.tensorrt_backend == "unknown"  # attempted; the build Job's probe refuses an image without it
    torch = llm_api_options(engine("pytorch").spec, None, 8, c)
    for release in S.releases():
        row = S.get(release)
        assert c.cuda_graph_keys <= row.cuda_graph_keys
        # An unknown image may be any release: what a PyTorch engine renders for it, every release accepts.
        assert rejected_keys(torch, row, "pytorch") == [], release
        if not row.tensorrt_removed:  # ... and a TensorRT one, every release that has the backend
            assert c.scheduler_config_keys <= row.scheduler_config_keys
            assert row.pytorch_only_keys - {"perf_metrics_max_requests"} <= c.pytorch_only_keys


def test_a_release_newer_than_every_row_is_pytorch_only_and_no_bolder_than_the_pytorch_rows() -> None:
    newer = S.get(S.NEWER)
    assert newer.tensorrt_removed and newer.autotuner_cache_env == "TLLM_AUTOTUNER_CACHE_PATH"
    removed = [S.get(r) for r in S.releases() if S.get(r).tensorrt_removed]
    assert removed and {r.release for r in removed} == {"1.3.0rc21", "1.4"}
    for row in removed:
        assert newer.scheduler_config_keys <= row.scheduler_config_keys
        assert newer.cuda_graph_keys <= row.cuda_graph_keys
    assert "dynamic_batch_config" not in newer.scheduler_config_keys


def test_the_recorded_surface_wins_and_a_mismatch_is_a_condition_not_a_crash() -> None:
    image = f"{IMAGE}:1.2.0"
    surface, message = S.effective(image, {"version": "1.3.0rc7", "trtLlmArgsHasPerfMetricsMaxRequests": True})
    assert surface.release == "1.3" and surface.trt_has_perf_metrics_max_requests
    assert message and "tagged as TensorRT-LLM release 1.2.0" in message and "1.3.0rc7" in message
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
    named = engine("simulated", runtime__env=[{"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3.0rc7"}])
    surface, how, _ = serving_surface(named.spec, "ghcr.io/kvpilot/kvsim:0.1.0", None)
    assert (surface.release, how) == ("1.3", "kvsim")
    torch = engine("simulated", runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "backend": "pytorch"},
                   runtime__env=[{"name": "KVSIM_TRTLLM_RELEASE", "value": "1.4"}])
    surface, how, refused = serving_surface(torch.spec, "ghcr.io/kvpilot/kvsim:0.1.0", None)
    assert (surface.release, how, refused) == ("1.4", "kvsim", None)
    options = llm_api_options(torch.spec, None, 8, surface)
    assert "cuda_graph_config" in options and "dynamic_batch_config" not in options["scheduler_config"]
    assert "return_perf_metrics" in llm_api_options(named.spec, None, 8, surface)
    assert "return_perf_metrics" not in llm_api_options(default.spec, None, 8, S.get("1.2.0"))


def test_every_row_cites_sources() -> None:
    for release in S.releases():
        assert S.get(release).sources and all(len(s) > 20 for s in S.get(release).sources)


def _kvsim_rows() -> list:
    """Every row; those kvsim cannot play yet are strict expected failures (kvsim's own release table grows on the
    kvsim branch: when it plays them, this test says so and the mark goes)."""
    from kvsim.trtllm.releases import RELEASES

    out = []
    for row in S.releases():
        line = ".".join(row.split(".")[:2])
        known = row in RELEASES or line in RELEASES
        out.append(row if known else pytest.param(row, marks=pytest.mark.xfail(
            raises=ValueError, strict=True, reason=f"kvsim does not play TensorRT-LLM {row} yet")))
    return out


@pytest.mark.parametrize("release", _kvsim_rows())
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
    options, cond = served({"version": "1.3.0rc7", "trtLlmArgsHasPerfMetricsMaxRequests": True})
    assert options["return_perf_metrics"] is True
    assert (cond["status"], cond["reason"]) == ("False", "ReleaseMismatch") and "1.3.0rc7" in cond["message"]
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
