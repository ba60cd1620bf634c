"""``runtime.env`` may neither repeat a name nor set one kvpilot sets itself (issue 22, item 3), and the reserved
list is exactly what the renderers render: a new env name in a pod template fails here until it is reserved.

Admission is checked through ``validate_manifest``, which evaluates the CRD's own CEL rules (the e2e test
tests/e2e/test_tenancy_env.py sends the same manifests to a real API server).
"""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot.api.crd import spec_openapi
from kvpilot.api.reserved_env import HOSTNAME, RESERVED_ENV
from kvpilot.api.validate import validate_manifest
from tests.cases.engines import base
from tests.unit.test_pod_hardening import pods  # the build and serving pod specs of one engine

CRD_FILE = Path(__file__).parents[2] / "crds" / "serving.kvpilot.io_inferenceengines.yaml"
USER_ENV = [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "KVSIM_TRTLLM_RELEASE", "value": "1.2.0"}]
SOURCES = ("hf://meta-llama/Llama-3.1-8B-Instruct", "s3://models-bucket/llama", "pvc://models/llama")


def env_names(node: Any) -> set[str]:
    """Every name in every ``env`` list anywhere in a rendered object (containers, init containers, and any
    container a future renderer adds)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                found |= {item["name"] for item in value if isinstance(item, dict)}
            else:
                found |= env_names(value)
    elif isinstance(node, list):
        for item in node:
            found |= env_names(item)
    return found


def rendered_env_names() -> set[str]:
    """The env names kvpilot renders over every backend x model source, credentials on, runtime.env set."""
    names: set[str] = set()
    for backend, source in product(("tensorrt", "pytorch", "simulated"), SOURCES):
        job, serve, _plan = pods(backend, model__source=source, runtime__env=USER_ENV)
        names |= env_names(job) | env_names(serve)
    return names - {var["name"] for var in USER_ENV}


def test_every_env_name_kvpilot_renders_is_reserved_and_every_reserved_name_is_rendered() -> None:
    rendered = rendered_env_names()
    assert rendered - set(RESERVED_ENV) == set(), "rendered but not reserved: add them to api/reserved_env.py"
    # HOSTNAME is the container runtime's (the build script relies on it); every other reserved name is rendered.
    assert set(RESERVED_ENV) - rendered == {HOSTNAME}
    assert len(set(RESERVED_ENV)) == len(RESERVED_ENV)


def test_the_user_env_reaches_both_containers() -> None:
    job, serve, _ = pods("tensorrt", runtime__env=USER_ENV)
    assert {"NCCL_DEBUG", "KVSIM_TRTLLM_RELEASE"} <= env_names(job) and {"NCCL_DEBUG"} <= env_names(serve)


def errors_for(env: list[dict[str, Any]], backend: str = "simulated") -> list[str]:
    doc = base("e1", backend)
    doc["spec"]["runtime"]["env"] = env
    _out, errors = validate_manifest(doc, spec_openapi())
    return [str(e) for e in errors]


@pytest.mark.parametrize("name", RESERVED_ENV)
def test_a_reserved_name_is_refused_naming_the_field_and_the_variable(name: str) -> None:
    errors = errors_for([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": name, "value": "x"}])
    assert len(errors) == 1, errors
    assert errors[0].startswith("spec.runtime.env[1].name: ")
    assert f"runtime.env name {name} is set by kvpilot itself" in errors[0]


def test_a_repeated_name_is_refused_naming_it() -> None:
    errors = errors_for([{"name": "A", "value": "1"}, {"name": "B"}, {"name": "A", "value": "2"}], "tensorrt")
    assert errors == ['spec.runtime.env: Invalid value: "array": runtime.env sets A more than once; each name '
                      "may appear only once (the API server refuses a container whose env repeats a name)"]


def test_distinct_names_of_the_users_own_are_accepted_and_names_are_case_sensitive() -> None:
    assert errors_for([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "hf_token"}, {"name": "HF_HUB_OFFLINE"},
                       {"name": "KVSIM_TRTLLM_RELEASE", "value": "1.2.0"}]) == []
    assert errors_for([]) == []


def test_the_crd_lists_the_reserved_names_and_carries_the_rules() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    env = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["runtime"][
        "properties"]["env"]
    for name in RESERVED_ENV:
        assert name in env["description"], name
    assert [rule["rule"] for rule in env["x-kubernetes-validations"]] == [
        "self.all(e, self.exists_one(f, f.name == e.name))"]
    (name_rule,) = env["items"]["properties"]["name"]["x-kubernetes-validations"]
    assert all(f"'{name}'" in name_rule["rule"] for name in RESERVED_ENV)
