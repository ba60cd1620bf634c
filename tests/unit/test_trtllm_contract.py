"""The contract check and the build Job's probe: the compare logic on recorded outputs, and the probe itself run
against a stand-in ``tensorrt_llm`` package (the real image is not available here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpilot.trtllm.contract import compare, report
from kvpilot.trtllm.probe import probe_source, record_lines
from tests.unit.helpers import engine

DATA = Path(__file__).parent / "data"
RECORDED = json.loads((DATA / "trtllm-probe-1.2.0.json").read_text())
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"


def diffs(probe: dict, image: str = "") -> dict[str, str]:
    return {f.topic: f.message for f in compare(probe, image)[1] if not f.ok}


def test_a_1_2_0_image_matches_its_row() -> None:
    release, findings = compare(RECORDED, f"{IMAGE}:1.2.0")
    assert release == "1.2.0" and all(f.ok for f in findings), [f.line() for f in findings]


def test_a_patched_image_whose_trtllmargs_gained_the_field_is_reported() -> None:
    patched = {**RECORDED, "trtLlmArgsHasPerfMetricsMaxRequests": True,
               "trtLlmArgsFields": [*RECORDED["trtLlmArgsFields"], "perf_metrics_max_requests"]}
    assert "present" in diffs(patched)["TrtLlmArgs.perf_metrics_max_requests"]


def test_a_1_3_image_under_a_1_2_tag_is_reported_with_the_row_to_contribute() -> None:
    newer = {**RECORDED, "version": "1.3.0rc7", "trtLlmArgsHasPerfMetricsMaxRequests": True,
             "collectorPrefix": "trtllm_", "collectorNames": ["trtllm_time_to_first_token_seconds"],
             "schedulerConfigFields": [*RECORDED["schedulerConfigFields"], "waiting_queue_policy"]}
    found = diffs(newer, f"{IMAGE}:1.2.0")
    assert "names release 1.2.0, the image reports 1.3.0rc7" in found["image tag"]
    assert "trtllm_request_success_total" in found["collector"]  # the 1.3 row expects more names than seen
    out, ok = report(newer, f"{IMAGE}:1.2.0")
    assert not ok and "Row to contribute" in out and "waiting_queue_policy" in out


def test_missing_facts_and_unknown_versions_are_findings_not_errors() -> None:
    found = diffs({"probeError": "tensorrt_llm: libcuda.so.1: cannot open shared object file"})
    assert "libcuda" in found["version"] and "not read" in found["collector"]
    assert "no row" in diffs({**RECORDED, "version": "2.0.0"})["version"]
    lacking = {**RECORDED, "serveOptions": ["--host", "--port"]}
    assert "--extra_llm_api_options" in diffs(lacking)["trtllm-serve"]
    torch_only = {**RECORDED, "trtLlmArgsFields": [*RECORDED["trtLlmArgsFields"], "enable_iter_perf_stats"]}
    assert "enable_iter_perf_stats" in diffs(torch_only)["TrtLlmArgs"]
    assert compare({"version": 12, "serveOptions": "x", "collectorNames": [1, None]})[0] == "conservative"


@pytest.fixture
def fake_tensorrt_llm(tmp_path: Path) -> Path:
    """A stand-in package with the attributes the probe reads, as 1.2.0 lays them out."""
    pkg = tmp_path / "site" / "tensorrt_llm"
    for sub in ("llmapi", "metrics", "commands"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text('__version__ = "1.2.0"\n')
    (pkg / "llmapi" / "llm_args.py").write_text(textwrap.dedent(f"""
        class TrtLlmArgs: model_fields = dict.fromkeys({RECORDED['trtLlmArgsFields']!r})
        class TorchLlmArgs: model_fields = dict.fromkeys({RECORDED['torchLlmArgsFields']!r})
        class SchedulerConfig: model_fields = dict.fromkeys({RECORDED['schedulerConfigFields']!r})
    """))
    (pkg / "metrics" / "collector.py").write_text(textwrap.dedent("""
        histogram_time_to_first_token = Histogram(name="time_to_first_token_seconds")
        histogram_e2e = Histogram(name="e2e_request_latency_seconds")
        counter_request_success = Counter(name="request_success")
    """))
    (pkg / "commands" / "serve.py").write_text(textwrap.dedent(f"""
        class _P:
            def __init__(self, *opts): self.opts = list(opts)
        class _Cmd: params = [_P(o) for o in {RECORDED['serveOptions']!r}]
        class _Group: commands = {{"serve": _Cmd()}}
        main = _Group()
    """))
    bin_dir = tmp_path / "site" / "bin"  # 1.2.0 still ships trtllm-build
    bin_dir.mkdir()
    (bin_dir / "trtllm-build").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "trtllm-build").chmod(0o755)
    return tmp_path / "site"


def run_probe(site: Path, full: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", probe_source(full)], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(site), "PATH": str(site / "bin")})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_probe_reads_an_image_and_its_output_matches_the_row(fake_tensorrt_llm: Path) -> None:
    probe = run_probe(fake_tensorrt_llm, full=True)
    assert probe["version"] == "1.2.0" and probe["trtLlmArgsHasPerfMetricsMaxRequests"] is False
    assert probe["collectorPrefix"] == "" and "request_success_total" in probe["collectorNames"]
    assert set(probe["serveOptions"]) == set(RECORDED["serveOptions"]) and "probeError" not in probe
    release, findings = compare(probe, f"{IMAGE}:1.2.0")
    assert release == "1.2.0"
    assert {f.topic for f in findings if not f.ok} == {"collector"}  # the stand-in has 3 of the 5 names


def test_the_build_job_records_the_probe_into_the_manifest(fake_tensorrt_llm: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "kvpilot-engine.json"
    manifest.write_text(json.dumps({"fingerprint": "f"}) + "\n")
    script = "set -euo pipefail\n" + "\n".join(record_lines(f'"{manifest}"')) + "\n"
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {"PYTHONPATH": str(fake_tensorrt_llm), "PATH": f"{bindir}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(manifest.read_text())
    assert recorded["fingerprint"] == "f" and recorded["trtllm"]["version"] == "1.2.0"
    assert recorded["trtllm"]["trtLlmArgsHasPerfMetricsMaxRequests"] is False
    assert "trtLlmArgsFields" not in recorded["trtllm"]  # the termination message stays small
    # An image without tensorrt_llm: the build goes on, the manifest records why.
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": env["PATH"]})
    assert proc.returncode == 0 and "No module named" in json.loads(manifest.read_text())["trtllm"]["probeError"]


def test_doctor_cli_exit_codes(tmp_path: Path) -> None:
    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvpilot.cli", "doctor", "trtllm", *args], capture_output=True,
                              text=True, timeout=60)

    assert doctor(f"{IMAGE}:1.2.0", "--probe", str(DATA / "trtllm-probe-1.2.0.json")).returncode == 0
    (tmp_path / "new.json").write_text(json.dumps({**RECORDED, "version": "1.4.0"}))
    proc = doctor(f"{IMAGE}:1.4.0", "--probe", str(tmp_path / "new.json"))
    assert proc.returncode == 1 and "Row to contribute" in proc.stdout
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    bad = doctor("--probe", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--probe" in bad.stderr
    assert "import json" in doctor("--print-probe").stdout


def _refuse(site: Path, version: str | None, path: str) -> subprocess.CompletedProcess[str]:
    from kvpilot.trtllm.probe import refuse_lines

    if version is not None:
        (site / "tensorrt_llm" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    else:
        (site / "tensorrt_llm" / "__init__.py").write_text('raise ImportError("libcuda.so.1")\n')
    script = "\n".join(["set -euo pipefail", *refuse_lines(f"{IMAGE}:custom", engine("tensorrt").spec)])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(site), "PATH": f"{path}:/usr/bin:/bin"})


def test_the_build_job_refuses_an_image_without_the_tensorrt_backend_before_anything_runs(
        fake_tensorrt_llm: Path) -> None:
    """Where only the image can tell (a custom tag): the version it reports, or the missing trtllm-build."""
    from kvpilot.trtllm.probe import REFUSED_EXIT_CODE

    site, with_build, without = fake_tensorrt_llm, str(fake_tensorrt_llm / "bin"), "/nonexistent"
    ok = _refuse(site, "1.2.1", with_build)
    assert ok.returncode == 0 and "has the TensorRT backend (TensorRT-LLM 1.2.1)" in ok.stdout
    for version, path in (("1.4.0rc1", without), ("1.3.0rc22", with_build)):  # the version alone decides
        refused = _refuse(site, version, path)
        assert refused.returncode == REFUSED_EXIT_CODE, refused.stderr
        assert f"image {IMAGE}:custom is TensorRT-LLM {version}, a release without the TensorRT backend" in \
            refused.stderr and "set runtime.backend: pytorch" in refused.stderr
    unread = _refuse(site, None, without)  # the version unread, trtllm-build missing
    assert unread.returncode == REFUSED_EXIT_CODE and "has no trtllm-build on its PATH" in unread.stderr
    assert _refuse(site, None, with_build).returncode == 0  # unread but the tool is there: build


def test_the_contract_check_expects_no_trtllm_build_where_the_row_removed_it() -> None:
    probe = {"version": "1.4.0rc1", "trtllmBuild": True, "torchLlmArgsFields": ["max_batch_size"]}
    release, findings = compare(probe, f"{IMAGE}:1.4.0rc1")
    assert release == "1.4"
    backend = {f.topic: f for f in findings}["TensorRT backend"]
    assert not backend.ok and "removed" in backend.message
    assert "TrtLlmArgs" not in {f.topic for f in findings}  # gone with the backend: not a difference
    assert {f.topic: f for f in compare({**probe, "trtllmBuild": False})[1]}["TensorRT backend"].ok


def test_the_probe_s_refusal_is_a_release_contract_condition_naming_the_image(fake_tensorrt_llm: Path) -> None:
    """Where only the image can tell, the build Job refuses (exit 42); its message, read back from the failed
    Job, makes EngineReady/Degraded BuildFailed and ReleaseContract BackendRemoved, each naming the image."""
    from datetime import datetime, timezone

    from kvpilot.api.status import status_dict
    from kvpilot.desired.observed import JobState, Observed
    from kvpilot.desired.plan import Settings, plan
    from kvpilot.trtllm.probe import refusal_in

    refused = _refuse(fake_tensorrt_llm, "1.4.0rc1", "/nonexistent")
    ie = engine("tensorrt", runtime__image=f"{IMAGE}:custom")
    now, settings = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc), Settings()
    started = plan(ie, Observed(claim_phase="Bound"), settings, now)
    assert started.build_job is not None  # the tag says nothing: the Job runs and its probe decides
    # The pod's termination message (the refusal, then whatever the log tail adds) as the Job reports it.
    job = JobState(name=started.build_job["metadata"]["name"], active=False, succeeded=False, failed=True,
                   message=f"+ check that the image has the TensorRT backend\n{refused.stderr}")
    failed = plan(ie, Observed(claim_phase="Bound", job=job, status=started.status), settings, now)
    conds = {c["type"]: c for c in status_dict(failed.status)["conditions"]}
    contract = conds["ReleaseContract"]
    assert (contract["status"], contract["reason"]) == ("False", "BackendRemoved")
    assert contract["message"].startswith(f"kvpilot: refused before anything ran: image {IMAGE}:custom is "
                                          "TensorRT-LLM 1.4.0rc1") and "set runtime.backend: pytorch" in contract["message"]
    for kind in ("EngineReady", "Degraded"):
        assert conds[kind]["reason"] == "BuildFailed" and f"{IMAGE}:custom" in conds[kind]["message"]
    # Any other failure is not a refusal: the contract says what the tag says.
    other = plan(ie, Observed(claim_phase="Bound", job=JobState(job.name, False, False, True, message="OOM"),
                              status=started.status), settings, now)
    assert {c["type"]: c for c in status_dict(other.status)["conditions"]}["ReleaseContract"]["reason"] == \
        "UnknownRelease"
    assert refusal_in(None) is None and refusal_in("kvpilot: refused before anything ran: x\ny") == \
        "kvpilot: refused before anything ran: x"
