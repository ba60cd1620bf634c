"""The GitOps e2e's differ (tests/e2e/diff_without_status.py): status aside, as Argo CD compares a custom resource."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.diff_without_status import main

ENGINE = {"apiVersion": "serving.kvpilot.io/v1alpha1", "kind": "InferenceEngine", "metadata": {"name": "gitops"},
          "spec": {"serving": {"replicas": 1}}, "status": {"kvCache": {"activeRequests": 1}}}


def dirs(tmp_path: Path, live: dict[str, object], merged: dict[str, object]) -> tuple[Path, Path]:
    for side, doc in (("live", live), ("merged", merged)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "engine").write_text(yaml.safe_dump(doc))
    return tmp_path / "live", tmp_path / "merged"


def test_a_status_written_between_the_two_reads_is_no_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    moved = {**ENGINE, "status": {"kvCache": {"activeRequests": 2}}}
    assert main(*dirs(tmp_path, ENGINE, moved)) == 0
    assert capsys.readouterr().out == ""


def test_a_spec_change_is_one_and_is_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scaled = {**ENGINE, "spec": {"serving": {"replicas": 2}}}
    assert main(*dirs(tmp_path, ENGINE, scaled)) == 1
    out = capsys.readouterr().out
    assert "-    replicas: 1" in out and "+    replicas: 2" in out


def test_an_object_only_one_side_has_differs(tmp_path: Path) -> None:
    live, merged = dirs(tmp_path, ENGINE, ENGINE)
    (merged / "service").write_text(yaml.safe_dump({"kind": "Service", "metadata": {"name": "gitops"}}))
    assert main(live, merged) == 1
