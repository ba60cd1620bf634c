"""`kvpilot cache ls|prune`: the rendered scripts run for real on a directory laid out like a cache claim."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from unittest import mock

import pytest

from kvpilot.cli import main
from kvpilot.desired import cache_jobs as C

KEEP, OLD, RECENT, NO_MANIFEST = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def layout(root: Path) -> Path:
    cache = root / "engines"
    for fp in (KEEP, OLD, RECENT, NO_MANIFEST):
        (cache / fp / "engine").mkdir(parents=True)
    for fp in (KEEP, OLD, RECENT):
        (cache / fp / "kvpilot-engine.json").write_text('{"fingerprint": "%s"}' % fp)
    two_hours_ago = time.time() - 7200
    for fp in (KEEP, OLD):
        os.utime(cache / fp / "kvpilot-engine.json", (two_hours_ago, two_hours_ago))
    (cache / ".staging" / "x").mkdir(parents=True)
    (cache / ".models" / "m").mkdir(parents=True)
    (cache / "notes").mkdir()
    return cache


def run_job(cache: Path, job: dict) -> subprocess.CompletedProcess[str]:  # type: ignore[type-arg]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def render(cache: Path, fn, *args, **kwargs) -> dict:  # type: ignore[no-untyped-def, type-arg]
    with mock.patch.object(C, "CACHE_MOUNT", str(cache)):
        return fn(*args, **kwargs)  # type: ignore[no-any-return]


def test_prune_deletes_old_engines_not_kept_and_nothing_else(tmp_path: Path) -> None:
    cache = layout(tmp_path)
    result = run_job(cache, render(cache, C.prune_job, "engines", "ns", (KEEP,)))
    assert result.returncode == 0, result.stderr
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([".models", ".staging", "notes", KEEP, RECENT, NO_MANIFEST])
    assert f"deleted {OLD}" in result.stdout and f"too recent {RECENT}" in result.stdout


def test_prune_dry_run_deletes_nothing(tmp_path: Path) -> None:
    cache = layout(tmp_path)
    result = run_job(cache, render(cache, C.prune_job, "engines", "ns", (), dry_run=True, downloads=True))
    assert result.returncode == 0, result.stderr
    assert f"would delete {OLD}" in result.stdout and "would delete .models" in result.stdout
    assert (cache / OLD).exists() and (cache / ".models").exists()


def test_prune_downloads(tmp_path: Path) -> None:
    cache = layout(tmp_path)
    assert run_job(cache, render(cache, C.prune_job, "engines", "ns", (KEEP,), downloads=True)).returncode == 0
    assert not (cache / ".models").exists()


def test_ls_lists_published_engines_with_their_manifest(tmp_path: Path) -> None:
    cache = layout(tmp_path)
    job = render(cache, C.ls_job, "engines", "ns")
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] is True
    result = run_job(cache, job)
    assert result.returncode == 0, result.stderr
    listed = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert sorted(listed) == sorted([KEEP, OLD, RECENT, ".staging", ".models"])


@pytest.mark.parametrize("argv, words", [
    (["cache", "prune", "--claim", "engines"], "--keep"),
    (["cache", "prune", "--claim", "engines", "--keep", "$(touch x)"], "--keep"),
    (["cache", "ls", "--claim", "Bad;claim"], "--claim"),
    (["cache", "ls", "--claim", "engines", "-n", "a b"], "--namespace"),
])
def test_bad_flags_are_errors_naming_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err


def test_cache_commands_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["cache", "--help"], ["cache", "ls", "--help"], ["cache", "prune", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
    assert "--min-age-minutes" in capsys.readouterr().out
