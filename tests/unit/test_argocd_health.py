"""The Argo CD health check of InferenceEngine (deploy/argocd/inferenceengine-health.lua), run by a real Lua
interpreter (hack/argocd_health.py) on status objects captured from the GitOps e2e (deploy/argocd/testdata,
written by tests/e2e/test_gitops.py with KVPILOT_CAPTURE_ARGOCD=1) and on the edge cases around them."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from hack import argocd_health

ROOT = Path(__file__).resolve().parents[2]

TESTDATA = ROOT / "deploy" / "argocd" / "testdata"
CAPTURED = sorted(TESTDATA.glob("*.yaml"))


def load(name: str) -> dict:
    return yaml.safe_load((TESTDATA / f"{name}.yaml").read_text())


def test_every_state_was_captured() -> None:
    assert {p.stem for p in CAPTURED} == {"progressing", "healthy", "degraded"}


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: p.stem)
def test_captured_status_objects_get_their_health(path: Path) -> None:
    status, message = argocd_health.health(yaml.safe_load(path.read_text()))
    assert status.lower() == path.stem and message


def test_a_status_behind_the_spec_is_progressing_even_when_it_says_healthy() -> None:
    obj = load("healthy")
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    assert argocd_health.health(obj)[0] == "Progressing"
    del obj["status"]
    assert argocd_health.health(obj) == ("Progressing", "Waiting for the operator to report status")


def test_a_stuck_rollout_is_degraded_and_scaled_to_zero_is_healthy() -> None:
    obj = load("healthy")
    for c in obj["status"]["conditions"]:
        if c["type"] == "Progressing":
            c.update(status="False", reason="ProgressDeadlineExceeded", message="The rollout did not finish in time")
    assert argocd_health.health(obj)[0] == "Degraded"
    zero = load("healthy")
    for c in zero["status"]["conditions"]:
        if c["type"] == "Available":
            c.update(status="False", reason="ScaledToZero", message="spec.serving.replicas is 0")
    assert argocd_health.health(zero)[0] == "Healthy"
    not_ready = copy.deepcopy(zero)
    for c in not_ready["status"]["conditions"]:
        if c["type"] == "Available":
            c.update(reason="PodsNotReady", message="No serving pod is ready yet")
    assert argocd_health.health(not_ready) == ("Progressing", "PodsNotReady: No serving pod is ready yet")


def test_the_docs_ship_the_same_script() -> None:
    doc = (ROOT / "docs" / "gitops.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert block is not None
    data = yaml.safe_load(block.group(1))["data"]
    assert data["resource.customizations.health.serving.kvpilot.io_InferenceEngine"] == argocd_health.HEALTH_LUA.read_text()
