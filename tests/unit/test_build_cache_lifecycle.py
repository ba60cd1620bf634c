"""The engine cache is a lifecycle, not a pile (issue 13, finding 6): failed builds leave no staging
directory, orphans of dead pods are collected, and a claim the operator created outlives every engine."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.observed import Observed
from kvpilot.trtllm.build import ORPHAN_AFTER_MINUTES
from tests.unit import script_sandbox as SB
from tests.unit.helpers import engine

FP = "fedcba9876543210fedcba9876543210"


def _spec(backend: str = "tensorrt"):  # type: ignore[no-untyped-def]
    return engine(backend, engineCache={"claimName": "engines"}).spec


def test_a_failed_build_removes_its_staging_directory(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path, failing=("trtllm-build",))
    result = SB.run(sb, SB.render(sb, _spec(), FP))
    assert result.returncode != 0
    assert (sb.argv_dir / "0001").exists(), "trtllm-build was reached"
    assert list((sb.cache / ".staging").iterdir()) == []
    assert not (sb.cache / FP).exists()


def test_a_failed_conversion_removes_its_staging_directory(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path, failing=("python3",))
    result = SB.run(sb, SB.render(sb, _spec(), FP))
    assert result.returncode != 0
    assert list((sb.cache / ".staging").iterdir()) == []


def test_orphaned_staging_directories_are_collected_and_live_ones_kept(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path)
    staging = sb.cache / ".staging"
    orphan, live = staging / "aaaa-dead-pod", staging / "bbbb-running-pod"
    for d in (orphan, live):
        (d / "checkpoint").mkdir(parents=True)
    old = time.time() - (ORPHAN_AFTER_MINUTES + 5) * 60
    os.utime(orphan, (old, old))
    recent = time.time() - (ORPHAN_AFTER_MINUTES - 60) * 60  # older than any default deadline, still possible
    os.utime(live, (recent, recent))
    result = SB.run(sb, SB.render(sb, _spec("simulated"), FP))
    assert result.returncode == 0, result.stderr
    assert not orphan.exists()
    assert live.exists()
    assert (sb.cache / FP / "kvpilot-engine.json").is_file()


def test_a_successful_build_leaves_no_staging_directory(tmp_path: Path) -> None:
    sb = SB.make_sandbox(tmp_path)
    assert SB.run(sb, SB.render(sb, _spec(), FP)).returncode == 0
    assert list((sb.cache / ".staging").iterdir()) == []


def _claim(name: str, uid: str) -> dict:  # type: ignore[type-arg]
    e = engine(name=name, uid=uid, engineCache={"claimName": "shared-engines", "size": "100Gi"})
    p = plan(e, Observed(claim_phase="Bound"), Settings(), __import__("datetime").datetime(2026, 12, 1))
    return next(o for o in p.apply if o["kind"] == "PersistentVolumeClaim")


def test_a_created_claim_has_no_owner_so_deleting_any_engine_keeps_it() -> None:
    a, b = _claim("a", "uid-a"), _claim("b", "uid-b")
    assert "ownerReferences" not in a["metadata"]
    # Every engine that shares the claim renders the same object, so their applies never fight over it.
    assert a == b
    assert "serving.kvpilot.io/engine" not in a["metadata"]["labels"]
    assert "docs/engine-cache.md" in a["metadata"]["annotations"]["serving.kvpilot.io/retention"]
