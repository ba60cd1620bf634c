"""Multi-node engines against the real LeaderWorkerSet controller and webhooks on the local cluster.

The golden renders (tests/golden/multinode/) pass a server-side dry run: the LWS CRD's schema and LWS's own
validating and mutating webhooks accept the rendered LeaderWorkerSet, and the API server the rest."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hack.testenv import cluster
from tests.e2e.conftest import run_kubectl

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "multinode"


@pytest.fixture(scope="module")
def bare_ns(kube: Path) -> Iterator[str]:
    """A namespace without the operator (nothing is stored in it: dry runs only)."""
    name = f"e2e-mn-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_rendered_children_pass_a_server_side_dry_run(bare_ns: str, golden: Path) -> None:
    docs = [d for d in yaml.safe_load_all(golden.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = bare_ns
    done = run_kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                       stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    assert done.returncode == 0, done.stderr
    items, pos, decoder = [], 0, json.JSONDecoder()  # one JSON document per object
    while done.stdout[pos:].strip():
        obj, end = decoder.raw_decode(done.stdout, pos + len(done.stdout[pos:]) - len(done.stdout[pos:].lstrip()))
        items.append(obj)
        pos = end
    (lws,) = [i for i in items if i["kind"] == "LeaderWorkerSet"]
    rendered = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    # The webhooks kept every field we set (they only default what is absent).
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == rendered["spec"]["leaderWorkerTemplate"]["size"]
    assert lws["spec"]["rolloutStrategy"] == rendered["spec"]["rolloutStrategy"]
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "Shared"}
    assert {i["kind"] for i in items} >= {"Secret", "ConfigMap", "LeaderWorkerSet", "Service"}
