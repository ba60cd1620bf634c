"""`runtime.env` names that repeat or that kvpilot sets itself are refused at admission by the real API server,
with the field and the variable named, and the same words as `kvpilot render`'s offline validator (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kvpilot.api.crd import spec_openapi
from kvpilot.api.reserved_env import RESERVED_ENV
from kvpilot.api.validate import validate_manifest
from tests.cases.engines import base
from tests.e2e.conftest import run_kubectl


def engine(env: list[dict[str, Any]]) -> dict[str, Any]:
    doc = base("env-check")
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["runtime"]["env"] = env
    return doc


def server_dry_run(doc: dict[str, Any]) -> tuple[bool, str]:
    result = run_kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
    return result.returncode == 0, result.stderr


def offline_messages(doc: dict[str, Any]) -> list[str]:
    _out, errors = validate_manifest(doc, spec_openapi())
    return [e.message for e in errors]


@pytest.mark.parametrize("name", [RESERVED_ENV[0], "HF_TOKEN", "TLLM_AUTOTUNER_CACHE_PATH", "HOSTNAME"])
def test_a_name_kvpilot_sets_is_refused_by_the_api_server_as_offline(chart: str, name: str) -> None:
    doc = engine([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": name, "value": "x"}])
    accepted, stderr = server_dry_run(doc)
    assert not accepted
    (message,) = offline_messages(doc)
    assert "spec.runtime.env[1].name" in stderr and message in stderr, stderr


def test_a_repeated_name_is_refused_by_the_api_server_as_offline(chart: str) -> None:
    doc = engine([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}])
    accepted, stderr = server_dry_run(doc)
    assert not accepted
    (message,) = offline_messages(doc)
    assert "runtime.env sets NCCL_DEBUG more than once" in message
    assert "spec.runtime.env" in stderr and message in stderr, stderr


def test_distinct_names_of_the_users_own_are_accepted(chart: str) -> None:
    accepted, stderr = server_dry_run(engine([{"name": "NCCL_DEBUG", "value": "INFO"},
                                              {"name": "KVSIM_TRTLLM_RELEASE", "value": "1.2.0"}]))
    assert accepted, stderr
