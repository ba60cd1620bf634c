"""Multi-node engines (desired/multinode.py): golden renders of the two shapes in examples/multinode (405B BF16
TP8xPP2 on 8-GPU H100 nodes, 70B TP4xPP2 on 4-GPU nodes; UPDATE_GOLDEN=1 rewrites), the LeaderWorkerSet
fields the design depends on, admission of shapes that cannot work, and the operator's SSH keys."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngine
from kvpilot.api.validate import validate_manifest
from kvpilot.cli import _BlockStyleDumper, load_engines
from kvpilot.desired import multinode, sshkeys
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import Settings, plan
from kvpilot.trtllm import multinode as MN

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples" / "multinode").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden" / "multinode"
KEYS = sshkeys.SshKeys(client_seed=bytes(range(32)), host_seed=bytes(range(32, 64)))  # fixed: stable goldens


def served_plan(engine: InferenceEngine) -> Any:
    """The plan once the engine is built: what the operator applies for it (and creates once)."""
    now = datetime.now(timezone.utc)
    fp = plan(engine, Observed(claim_phase="Bound"), Settings(), now).fingerprint
    return plan(engine, Observed(claim_phase="Bound", engine_index={fp: {"fingerprint": fp}}), Settings(), now)


def render(engine: InferenceEngine) -> list[dict[str, Any]]:
    """What the operator applies for the built engine, then its SSH Secret with fixed keys (it creates it once
    with fresh ones)."""
    p = served_plan(engine)
    return [d for d in p.apply if d["kind"] != "PersistentVolumeClaim"] + [
        multinode.ssh_secret(engine.meta, engine.spec, KEYS)]


def rendered(example: Path) -> list[dict[str, Any]]:
    (engine,) = load_engines(str(example))
    return render(engine)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_multinode_render_matches_golden(example: Path) -> None:
    out = yaml.dump_all(rendered(example), Dumper=_BlockStyleDumper, sort_keys=False, width=120)
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no golden file for {example.name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert out == golden.read_text()


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


@pytest.mark.parametrize(("stem", "nodes", "per_node", "groups"), [
    ("llama-3.1-405b-bf16-tp8pp2", 2, 8, 2), ("llama-3.1-70b-bf16-tp4pp2-4gpu", 2, 4, 1)])
def test_leader_worker_set_shape(stem: str, nodes: int, per_node: int, groups: int) -> None:
    docs = rendered(ROOT / "examples" / "multinode" / f"{stem}.yaml")
    lws = by_kind(docs, "LeaderWorkerSet")
    spec, tmpl = lws["spec"], lws["spec"]["leaderWorkerTemplate"]
    assert spec["replicas"] == groups and tmpl["size"] == nodes
    assert (tmpl["restartPolicy"], spec["startupPolicy"]) == ("RecreateGroupOnPodRestart", "LeaderCreated")
    leader, worker = tmpl["leaderTemplate"]["spec"]["containers"][0], tmpl["workerTemplate"]["spec"]["containers"][0]
    for c in (leader, worker):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(per_node)  # one pod per node, its GPUs
    # The leader launches trtllm-serve over every rank; the ranks' world is TP x PP = nodes x GPUs per node.
    assert leader["command"] == MN.leader_command() and leader["args"][0] == "trtllm-serve"
    args = leader["args"]
    tp, pp = int(args[args.index("--tp_size") + 1]), int(args[args.index("--pp_size") + 1])
    assert tp * pp == nodes * per_node
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert env["KVPILOT_MN_GPUS_PER_NODE"] == str(per_node)
    # Readiness and liveness on the leader; the worker is only sshd: a TCP readiness, no liveness.
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health" and "livenessProbe" in leader
    assert worker["command"] == MN.worker_command() and "livenessProbe" not in worker
    assert worker["readinessProbe"]["tcpSocket"]["port"] == "ssh"
    # The startup probe outlasts the workers' wait plus the model load: liveness never sees a loading group.
    startup = leader["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= MN.WORKER_WAIT_SECONDS + 1800
    # The Service and the scale selector match leaders only (component server), never workers.
    svc = by_kind(docs, "Service")
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    assert tmpl["leaderTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    assert tmpl["workerTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    pdb = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert len(pdb) == (1 if groups > 1 else 0)


def test_scripts_carry_no_spec_value() -> None:
    """Both engines get byte-identical scripts: every spec value reaches them as argv or env only."""
    first, second = (by_kind(rendered(p), "ConfigMap") for p in EXAMPLES)  # the LLM-API ConfigMap comes first
    scripts = [d for p in EXAMPLES for d in rendered(p) if d["kind"] == "ConfigMap" and "leader.sh" in d["data"]]
    assert len(scripts) == 2 and scripts[0]["data"] == scripts[1]["data"] == MN.scripts()
    assert first["data"] != second["data"]
    for text in MN.scripts().values():
        assert "llama" not in text and "/engines" not in text  # nothing of a spec: names, paths


@pytest.mark.parametrize(("tp", "pp", "per_node", "error"), [
    (8, 2, 8, None), (4, 1, 8, None), (4, 2, 4, None), (12, 1, 8, "must be at most serving.gpusPerNode"),
    (6, 1, 4, "a multiple of it"), (64, 64, 8, "spans at most 64 nodes")])
def test_admission_refuses_shapes_that_cannot_work(tp: int, pp: int, per_node: int, error: str | None) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "multinode" / "llama-3.1-405b-bf16-tp8pp2.yaml").read_text())
    doc["spec"]["build"].update(tensorParallelSize=tp, pipelineParallelSize=pp)
    doc["spec"]["serving"]["gpusPerNode"] = per_node
    _, errors = validate_manifest(doc, spec_openapi())
    messages = [f"{e.path}: {e.message}" for e in errors]
    if error is None:
        assert not messages
    else:
        assert any(m.startswith("spec.serving.gpusPerNode: ") and error in m and "build.tensorParallelSize" in m
                   for m in messages), messages


def test_ed25519_public_key_matches_rfc8032_test_vector_1() -> None:
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert sshkeys.public_key(seed).hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")
def test_openssh_reads_the_generated_private_key(tmp_path: Path) -> None:
    data = sshkeys.generate().secret_data("kvpilot@test")
    for private, public in ((MN.PRIVATE_KEY, MN.PUBLIC_KEY), (MN.HOST_KEY, MN.HOST_PUBLIC_KEY)):
        key = tmp_path / private
        key.write_text(data[private])
        key.chmod(0o600)
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
        assert derived.stdout.split()[:2] == data[public].split()[:2]


def test_the_secret_is_fixed_by_its_keys_and_authorizes_the_client_key() -> None:
    (engine,) = load_engines(str(EXAMPLES[0]))
    secret = multinode.ssh_secret(engine.meta, engine.spec, KEYS)
    assert multinode.ssh_secret(engine.meta, engine.spec, KEYS) == secret
    assert multinode.ssh_secret(engine.meta, engine.spec, sshkeys.generate())["data"] != secret["data"]
    assert base64.b64decode(secret["data"][MN.AUTHORIZED_KEYS]) == base64.b64decode(secret["data"][MN.PUBLIC_KEY])
    assert b"BEGIN OPENSSH PRIVATE KEY" in base64.b64decode(secret["data"][MN.HOST_KEY])


def example_doc(stem: str = "llama-3.1-405b-bf16-tp8pp2") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "multinode" / f"{stem}.yaml").read_text())  # type: ignore[no-any-return]


def test_admission_wants_one_shared_cache_for_all_nodes() -> None:
    doc = example_doc()
    doc["spec"]["runtime"] = {"backend": "pytorch"}
    doc["spec"]["build"] = {"tensorParallelSize": 8, "pipelineParallelSize": 2}
    del doc["spec"]["engineCache"]
    _, errors = validate_manifest(doc, spec_openapi())
    assert any(e.path == "spec" and "engineCache must be set for a multi-node engine" in e.message for e in errors)
    doc = example_doc()
    doc["spec"]["engineCache"]["accessMode"] = "ReadWriteOnce"
    _, errors = validate_manifest(doc, spec_openapi())
    assert [e.path for e in errors] == ["spec.engineCache.accessMode"]
    assert "ReadWriteMany for a multi-node engine" in errors[0].message


def test_the_build_of_a_multinode_engine_runs_on_one_node_for_every_rank() -> None:
    (engine,) = load_engines(str(EXAMPLES[0]))
    job = plan(engine, Observed(claim_phase="Bound"), Settings(), datetime.now(timezone.utc)).build_job
    assert job is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # one 8-GPU node, not 16 GPUs
    script = container["args"][0]
    # Both ranks' stages are converted (tp 8 x pp 2) and trtllm-build builds all 16 rank engines, as many at a
    # time as the node has GPUs (its --workers is capped by the GPUs it sees).
    assert "--tp_size 8 --pp_size 2" in script and "--workers 16" in script


def test_the_plan_creates_the_ssh_secret_once_with_fresh_keys() -> None:
    (engine,) = load_engines(str(EXAMPLES[0]))
    (once,) = served_plan(engine).create_once
    assert (once.kind, once.name) == ("Secret", multinode.ssh_secret_name(engine.meta))
    assert once.name.startswith("llama-405b-ssh-")  # and the engine's UID, hashed (issue 22)
    first, second = once.render(), once.render()
    assert first["data"][MN.PRIVATE_KEY] != second["data"][MN.PRIVATE_KEY]  # generated when created, not before
    assert first["metadata"]["ownerReferences"][0]["name"] == "llama-405b"
