"""The PyTorch backend's prepare Job (trtllm/prepare.py): the counterpart of the build, with the same cache
guarantees -- keyed by a fingerprint of every input, never prepared twice, a failed prepare leaves the last good
engine serving, staging cleaned -- and serving pods that mount its result read-only."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from kvpilot.api.status import status_dict
from kvpilot.desired.fingerprint import compute_fingerprint
from kvpilot.desired.observed import JobState, Observed
from kvpilot.desired.plan import Settings, plan
from kvpilot.trtllm import build_script as BS
from kvpilot.trtllm import prepare as PR
from kvpilot.trtllm.options import check
from kvpilot.trtllm.serve import serving_surface
from tests.unit import script_sandbox as SB
from tests.unit.helpers import engine

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
S = Settings(kvsim_image="ghcr.io/kvpilot/kvsim:0.1.0")
FP = "0123456789abcdef" * 4
SIM_TORCH = {"profile": "llama-3.1-8b-fp8-h100", "backend": "pytorch"}


def torch(**overrides: object):  # type: ignore[no-untyped-def]
    return engine("pytorch", **overrides)  # type: ignore[arg-type]


def sim_torch(**overrides: object):  # type: ignore[no-untyped-def]
    return engine("simulated", runtime__simulation=SIM_TORCH, **overrides)  # type: ignore[arg-type]


def job_of(p) -> JobState:  # type: ignore[no-untyped-def]
    return JobState(name=p.build_job["metadata"]["name"], active=False, succeeded=True, failed=False,
                    completion_time="2026-12-01T12:10:00Z", owner_uids=("uid-1",))


def kinds(p) -> list[str]:  # type: ignore[no-untyped-def]
    return [o["kind"] for o in p.apply]


def test_a_pytorch_engine_with_a_cache_prepares_before_anything_serves() -> None:
    p = plan(torch(), Observed(claim_phase="Bound"), S, NOW)
    assert p.build_job is not None and "Deployment" not in kinds(p)
    container = p.build_job["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "prepare" and "trtllm-build" not in container["args"][0]
    assert "podFailurePolicy" not in p.build_job["spec"]  # nothing to refuse: PyTorch runs on every release
    conds = {c["type"]: c for c in status_dict(p.status)["conditions"]}
    assert conds["EngineReady"]["reason"] == "Building" and conds["Available"]["reason"] == "EngineNotReady"


def test_every_prepare_command_uses_only_real_flags() -> None:
    for e in (torch(), torch(build__quantization="nvfp4"), sim_torch(), torch(model__source="pvc://models/llama")):
        spec = e.spec
        for command in PR.prepare_commands(spec, FP, 64):
            assert check(command) == [], command


def test_serving_mounts_the_prepared_checkpoint_read_only_and_copies_the_warm_up_cache() -> None:
    first = plan(torch(), Observed(claim_phase="Bound"), S, NOW)
    p = plan(torch(), Observed(status=first.status, claim_phase="Bound", job=job_of(first)), S, NOW)
    dep = next(o for o in p.apply if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["args"][0] == f"/engines/{first.fingerprint}/checkpoint" and "--revision" not in server["args"]
    cache = next(v for v in pod["volumes"] if v["name"] == "engines")
    assert cache["persistentVolumeClaim"]["readOnly"] is True
    assert all(m["readOnly"] for c in [server, *pod["initContainers"]] for m in c["volumeMounts"]
               if m["name"] == "engines")
    (warm,) = pod["initContainers"]
    assert warm["command"] == ["cp", "-R", f"/engines/{first.fingerprint}/warmup/.", "/var/cache/kvpilot/"]
    env = {e["name"]: e for e in server["env"]}
    assert env["TLLM_AUTOTUNER_CACHE_PATH"]["value"] == "/var/cache/kvpilot/autotuner.json"  # writable copy
    assert "HF_TOKEN" not in env and "HF_HOME" not in env  # nothing downloads any more


def test_a_pvc_checkpoint_is_served_in_place_and_only_warmed_up() -> None:
    e = torch(model__source="pvc://models/llama-8b")
    first = plan(e, Observed(claim_phase="Bound"), S, NOW)
    script = first.build_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "snapshot_download" not in script and "cp -al" not in script
    assert "trtllm-serve /model/llama-8b " in script  # the warm-up serves it where it is
    p = plan(e, Observed(status=first.status, claim_phase="Bound", job=job_of(first)), S, NOW)
    pod = next(o for o in p.apply if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][0] == "/model/llama-8b"
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_the_fingerprint_keys_every_prepare_input_and_no_runtime_knob() -> None:
    image = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1"
    base = compute_fingerprint(torch().spec, image, 512)
    changes = [dict(build__quantization="fp8"), dict(build__tensorParallelSize=2),
               dict(model__revision="1" * 40), dict(serving__gpuProduct="NVIDIA-H200"), dict(build__kvCacheDtype="fp8")]
    for change in changes:
        assert compute_fingerprint(torch(**change).spec, image, 512) != base, change
    assert compute_fingerprint(torch().spec, "nvcr.io/nvidia/tensorrt-llm/release:1.2.1", 512) != base
    same = [dict(batching__maxBatchSize=32), dict(batching__maxNumTokens=4096), dict(build__maxBatchSize=2048),
            dict(autotune__maxBatchSize=1024), dict(serving__replicas=3), dict(build__calibration__size=64)]
    for change in same:  # the calibration set only counts when quantizing
        assert compute_fingerprint(torch(**change).spec, image, 512) == base, change
    assert compute_fingerprint(torch().spec, image, 4096) == base  # a tuner ceiling request re-prepares nothing
    quantized = compute_fingerprint(torch(build__quantization="fp8").spec, image, 512)
    assert compute_fingerprint(torch(build__quantization="fp8", build__calibration__size=64).spec, image,
                               512) != quantized
    assert compute_fingerprint(sim_torch().spec, "kvsim", 512) != compute_fingerprint(engine().spec, "kvsim", 512)


def test_a_second_engine_with_the_same_inputs_shares_the_job_and_a_published_one_prepares_nothing() -> None:
    a, b = plan(torch(name="a"), Observed(claim_phase="Bound"), S, NOW), plan(
        torch(name="b", uid="uid-2"), Observed(claim_phase="Bound"), S, NOW)
    assert a.fingerprint == b.fingerprint and a.build_job["metadata"]["name"] == b.build_job["metadata"]["name"]
    published = plan(torch(name="b"), Observed(claim_phase="Bound",
                                               engine_index={a.fingerprint: {"fingerprint": a.fingerprint}}), S, NOW)
    assert published.build_job is None and published.status.build.state == "CacheHit"
    assert "Deployment" in kinds(published)


def test_a_failed_prepare_leaves_the_last_good_engine_serving() -> None:
    first = plan(torch(), Observed(claim_phase="Bound"), S, NOW)
    good = plan(torch(), Observed(status=first.status, claim_phase="Bound", job=job_of(first)), S, NOW)
    old = good.status.engine.fingerprint
    changed = torch(build__quantization="fp8")  # a new fingerprint: a new prepare
    started = plan(changed, Observed(status=good.status, claim_phase="Bound"), S, NOW)
    assert started.fingerprint != old and started.build_job is not None
    failed = JobState(name=started.build_job["metadata"]["name"], active=False, succeeded=False, failed=True,
                      message="kvpilot: the warm-up trtllm-serve exited with 1 before /health answered")
    p = plan(changed, Observed(status=started.status, claim_phase="Bound", job=failed), S, NOW)
    dep = next(o for o in p.apply if o["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][0] == f"/engines/{old}/checkpoint"
    conds = {c["type"]: c for c in status_dict(p.status)["conditions"]}
    assert conds["Degraded"]["reason"] == "BuildFailed" and "warm-up trtllm-serve" in conds["EngineReady"]["message"]
    assert p.status.engine.fingerprint == old


def test_the_limit_follows_the_spec_not_the_manifest() -> None:
    """A prepared checkpoint has no engine ceiling: the runtime limit is the spec's, even above what the warm-up
    served at, and CUDA graphs follow it."""
    first = plan(torch(), Observed(claim_phase="Bound"), S, NOW)
    manifest = {"fingerprint": first.fingerprint, "maxBatchSize": 8, "maxNumTokens": 512}
    e = torch(batching__maxBatchSize=256)
    p = plan(e, Observed(claim_phase="Bound", engine_index={first.fingerprint: manifest}), S, NOW)
    assert p.status.batching.max_batch_size == 256
    assert p.status.engine.max_batch_size == e.spec.autotune.max_batch_size  # the tuner's bound, not the manifest
    cm = next(o for o in p.apply if o["kind"] == "ConfigMap")
    options = yaml.safe_load(cm["data"]["llm-api.yaml"])
    assert options["max_batch_size"] == 256 and options["max_num_tokens"] == 8192
    assert options["cuda_graph_config"] == {"max_batch_size": 256, "enable_padding": True}


def test_cuda_graphs_are_capped_by_the_tokens_a_decode_batch_may_hold() -> None:
    """The engine drops sizes above min(max_batch_size, max_num_tokens) (model_engine._filter_cuda_graph_
    batch_sizes): asking for more would only log a warning."""
    from kvpilot.trtllm.serve import llm_api_options

    e = engine("pytorch", engineCache=None, batching__maxNumTokens=1024, build__maxInputLen=512,
               build__maxSeqLen=2048)
    assert llm_api_options(e.spec, None, 2048)["cuda_graph_config"] == {"max_batch_size": 1024,
                                                                        "enable_padding": True}


def test_the_warm_up_serves_what_serving_renders() -> None:
    spec = torch(batching__maxBatchSize=96).spec
    image = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1"
    surface = serving_surface(spec, image, None)[0]
    config = yaml.safe_load(PR.warmup_config(spec, 96, surface))
    assert config["max_batch_size"] == 96 and config["cuda_graph_config"]["max_batch_size"] == 96
    warm = PR.warmup(spec, PR.prepare_paths(spec, FP), 96)
    argv = list(warm.argv)
    serve = argv[argv.index("trtllm-serve"):]
    assert serve[1] == "$STAGE/checkpoint" and serve[serve.index("--max_batch_size") + 1] == "96"
    assert serve[serve.index("--extra_llm_api_options") + 1] == "$STAGE/warmup/llm-api.yaml"


def test_quantizing_runs_modelopt_on_the_fetched_checkpoint_with_its_calibration_set() -> None:
    spec = torch(build__quantization="nvfp4", build__calibration={"dataset": "pvc://datasets/cnn_dailymail",
                                                                  "size": 128, "maxSeqLength": 1024}).spec
    paths = PR.prepare_paths(spec, FP)
    fetch, quantize = PR.fetch_and_quantize(spec, paths)
    assert "snapshot_download" in fetch.argv[2]
    assert list(quantize.argv[3:]) == [paths.model_dir, "$STAGE/checkpoint", "NVFP4_DEFAULT_CFG", "bfloat16",
                                       "/calibration/cnn_dailymail", "128", "1024"]
    assert "export_hf_checkpoint(model, export_dir=dst)" in quantize.argv[2]
    assert PR.link_lines(spec, paths) == []  # ModelOpt writes the staged checkpoint itself
    script = BS.prepare_script(spec, FP, "img:1", 64, serving_surface(spec, "img:1", None)[0])
    assert script.index("kvpilot: calibration set") < script.index("snapshot_download")  # checked first


# --- The script, run for real: stubs first, then kvsim's own prepare and trtllm-serve. ---

def _render_prepare(sb: SB.Sandbox, spec, fingerprint: str = FP) -> str:  # type: ignore[no-untyped-def]
    with SB.mounts_in(sb):
        return BS.prepare_script(spec, fingerprint, "img:1", 64, serving_surface(spec, "img:1", None)[0])


def test_the_script_publishes_once_and_a_second_run_prepares_nothing(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path)
    spec = sim_torch().spec
    script = _render_prepare(sb, spec)
    assert SB.syntax_ok(script).returncode == 0
    first = SB.run(sb, script)
    assert first.returncode == 0, first.stderr
    calls = SB.recorded_argvs(sb)
    assert [c[:2] for c in calls] == [["kvsim", "prepare"], ["python3", "-c"]]  # kvsim's stand-in, the warm-up
    manifest = json.loads((sb.cache / FP / "kvpilot-engine.json").read_text())
    assert manifest["kind"] == "prepared" and manifest["fingerprint"] == FP
    assert json.loads(sb.termination_log.read_text()) == manifest
    assert list((sb.cache / ".staging").iterdir()) == []
    again = SB.run(sb, script)
    assert again.returncode == 0 and "nothing to prepare" in again.stdout
    assert len(SB.recorded_argvs(sb)) == len(calls)  # nothing ran the second time


def test_a_failed_prepare_publishes_nothing_and_leaves_no_staging(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path, failing=("kvsim",))
    result = SB.run(sb, _render_prepare(sb, sim_torch().spec))
    assert result.returncode != 0
    assert not (sb.cache / FP).exists() and list((sb.cache / ".staging").iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kvsim_prepares_and_the_warm_up_really_serves_before_it_publishes(tmp_path: Path) -> None:
    """No stubs: kvsim prepare writes the checkpoint and warm-up cache, the warm-up driver starts kvsim's
    trtllm-serve on the staged checkpoint with the rendered flags, waits for /health, stops it, and publishes."""
    sb = SB.Sandbox(tmp_path)
    for d in (sb.cache, sb.bin):
        d.mkdir(parents=True)
    venv_bin = Path(sys.executable).parent
    shim = sb.bin / "trtllm-serve"  # what the kvsim image (and the local kubelet) put on PATH
    shim.write_text(f'#!/bin/bash\nexec {venv_bin}/kvsim trtllm-serve "$@"\n')
    shim.chmod(0o755)
    port = _free_port()
    spec = sim_torch(serving__port=port, serving__startupTimeoutSeconds=60).spec
    script = _render_prepare(sb, spec).replace("0.0.0.0", "127.0.0.1")  # a shared machine: loopback only
    env = {"PATH": f"{sb.bin}:{venv_bin}:/usr/bin:/bin", "HOSTNAME": SB.HOSTNAME, "HOME": str(sb.root),
           "LC_ALL": "C.UTF-8", "KVSIM_PROFILE": SIM_TORCH["profile"], "KVSIM_TRTLLM_RELEASE": "1.2.1"}
    result = subprocess.run(["bash", "-c", script], env=env, cwd=sb.root, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "warm-up served /health after" in result.stdout
    engine_dir = sb.cache / FP
    assert json.loads((engine_dir / "checkpoint" / "config.json").read_text())["kvsim"]["profile"] == \
        SIM_TORCH["profile"]
    cache = json.loads((engine_dir / "warmup" / "autotuner.json").read_text())
    assert set(cache) == {"metadata", "rank_0"} and cache["metadata"]["lib_version"] == "1.2.1"
    assert not (engine_dir / "warmup" / "llm-api.yaml").exists()  # the warm-up's config is not published
    assert list((sb.cache / ".staging").iterdir()) == []


@pytest.mark.parametrize("quant", ["fp8", "nvfp4"])
def test_pytorch_quantization_is_admitted_with_an_engine_cache(quant: str) -> None:
    p = plan(torch(build__quantization=quant), Observed(claim_phase="Bound"), S, NOW)
    assert "export_hf_checkpoint" in p.build_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert p.status.build.state == "Building"


def test_a_multinode_pytorch_prepare_publishes_without_a_warm_up() -> None:
    """A multi-node engine's ranks do not fit the prepare Job's one pod: its prepare fetches and publishes, and
    serves nothing; a one-node engine still warms up (the kernel autotuner's cache)."""
    multi = torch(build__tensorParallelSize=8, build__pipelineParallelSize=2, serving__gpusPerNode=8,
                  engineCache={"claimName": "engines", "accessMode": "ReadWriteMany", "size": "1Ti"}).spec
    assert multi.multinode
    script = BS.prepare_script(multi, FP, "img:1", 64, serving_surface(multi, "img:1", None)[0])
    assert "warm-up skipped: a multi-node engine" in script and "until /health answers" not in script
    assert "snapshot_download" in script and "kvpilot-engine.json" in script
    single = torch().spec
    assert "until /health answers" in BS.prepare_script(single, FP, "img:1", 64,
                                                         serving_surface(single, "img:1", None)[0])
