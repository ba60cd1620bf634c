"""Unit tests of the local kubelet's pure parts (hack/testenv/podagent): no cluster needed."""

from __future__ import annotations

import base64
import time

import pytest

from hack.testenv.podagent.agent import IPAllocator
from hack.testenv.podagent.kube import WatchExpired
from hack.testenv.podagent.podspec import (
    ConfigError,
    bind_to_pod_ip,
    expand_vars,
    path_rewriter,
    plan_launch,
    resolve_env,
    resolve_program,
)
from hack.testenv.podagent.probes import LIVENESS, READINESS, STARTUP, ProbeTracker
from hack.testenv.podagent.status import ContainerStatus, disagrees, pod_conditions, pod_phase

POD = {
    "metadata": {"name": "web-0", "namespace": "ns1", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "gpu-h100-0"},
    "status": {"podIP": "127.2.0.7", "hostIP": "127.0.0.1"},
}


def lookup_from(objects: dict[tuple[str, str], dict]):
    """A lookup(kind, namespace, name) over a fixed set of objects (namespace ns1)."""
    return lambda kind, namespace, name: objects.get((kind, name))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-two"),
        ("$$(A)", "$(A)"),  # escaped reference stays literal
        ("$(UNDEFINED)", "$(UNDEFINED)"),  # undefined stays verbatim
        ("cost $5 and $$", "cost $5 and $"),
        ("$(A", "$(A"),  # unterminated
    ],
)
def test_expand_vars_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand_vars(text, {"A": "1", "B": "two"}) == expected


def test_path_rewriter_matches_whole_components_longest_first() -> None:
    rewrite = path_rewriter([("/engines", "/L/e"), ("/engines/cache/", "/L/c"), ("/data", "/L/d")])
    assert rewrite("--engine_dir=/engines/fp1") == "--engine_dir=/L/e/fp1"
    assert rewrite("/engines/cache/x") == "/L/c/x"
    assert rewrite("/database /srv/data /data") == "/database /srv/data /L/d"
    # a rewritten path is never rewritten again, even if it starts with another mount path
    assert path_rewriter([("/L", "/X"), ("/data", "/L/d")])("/data/f") == "/L/d/f"


def test_root_mount_is_never_rewritten() -> None:
    assert path_rewriter([("/", "/somewhere")])("/usr/bin/python3") == "/usr/bin/python3"


def test_bind_any_becomes_the_pod_ip_only_for_the_exact_address() -> None:
    assert bind_to_pod_ip("--host 0.0.0.0 --x=0.0.0.0:80", "127.2.0.9") == "--host 127.2.0.9 --x=127.2.0.9:80"
    assert bind_to_pod_ip("10.0.0.0.0", "127.2.0.9") == "10.0.0.0.0"


def test_resolve_env_reads_secrets_configmaps_and_fields_in_order() -> None:
    objects = {
        ("Secret", "hf"): {"data": {"token": base64.b64encode(b"s3cr3t").decode()}},
        ("ConfigMap", "cfg"): {"data": {"profile": "llama-3.1-8b-fp8-h100", "LEVEL": "debug"}},
    }
    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "KVSIM_PROFILE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "profile"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000"},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}},
        ],
    }
    env = resolve_env(container, POD, lookup_from(objects))
    assert env["HF_TOKEN"] == "s3cr3t"
    assert env["KVSIM_PROFILE"] == "llama-3.1-8b-fp8-h100"
    assert env["CFG_LEVEL"] == "debug"
    assert env["URL"] == "http://127.2.0.7:8000"
    assert env["APP"] == "web"
    assert "OPT" not in env


def test_resolve_env_names_the_missing_object_and_key() -> None:
    objects = {("ConfigMap", "cfg"): {"data": {}}}
    with pytest.raises(ConfigError, match="key 'nope' not found in ConfigMap ns1/cfg"):
        resolve_env(
            {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope"}}}]},
            POD,
            lookup_from(objects),
        )
    with pytest.raises(ConfigError, match="Secret ns1/hf not found"):
        resolve_env(
            {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "k"}}}]}, POD, lookup_from({})
        )


def test_plan_launch_maps_trtllm_to_shims_and_rewrites_mounts_and_host(tmp_path) -> None:
    container = {
        "name": "serve",
        "image": "kvpilot/kvsim:dev",
        "command": ["trtllm-serve"],
        "args": ["/engines/fp1", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/kvpilot/llm.yaml"],
        "env": [{"name": "ENGINE", "value": "/engines/fp1"}, {"name": "PATH", "value": "/usr/bin"}],
        "workingDir": "/engines",
    }
    mounts = [("/engines", "/local/engines"), ("/etc/kvpilot/llm.yaml", "/local/cfg/llm.yaml")]
    plan = plan_launch(
        container,
        POD,
        mounts,
        {"PATH": "/shims:/venv/bin"},
        {"trtllm-serve": "/shims/trtllm-serve"},
        str(tmp_path / "term"),
        str(tmp_path / "rootfs"),
        lookup_from({}),
    )
    assert plan.argv == [
        "/shims/trtllm-serve",
        "/local/engines/fp1",
        "--host",
        "127.2.0.7",
        "--port",
        "8000",
        "--config",
        "/local/cfg/llm.yaml",
    ]
    assert plan.env["ENGINE"] == "/local/engines/fp1"
    assert plan.env["PATH"].startswith("/shims:/venv/bin")  # an image PATH cannot hide the shims
    assert plan.cwd == "/local/engines"
    assert plan.env["HOSTNAME"] == "web-0"


def test_plan_launch_rewrites_the_termination_log_and_refuses_an_empty_command(tmp_path) -> None:
    container = {"name": "b", "command": ["sh", "-c", "echo done > /dev/termination-log"]}
    plan = plan_launch(container, POD, [], {}, {}, "/t/b", "/r", lookup_from({}))
    assert plan.argv[-1] == "echo done > /t/b"
    with pytest.raises(ConfigError, match="neither command nor args"):
        plan_launch({"name": "x", "image": "i"}, POD, [], {}, {}, "/t/x", "/r", lookup_from({}))


def test_resolve_program_falls_back_to_path_for_image_only_paths(tmp_path) -> None:
    (tmp_path / "python3").write_text("#!/bin/sh\n")
    (tmp_path / "python3").chmod(0o755)
    assert resolve_program("/usr/local/bin/nonexistent-dir/python3", {}, str(tmp_path)) == str(tmp_path / "python3")
    assert resolve_program("/usr/local/bin/trtllm-build", {"trtllm-build": "/s/tb"}, "") == "/s/tb"
    assert resolve_program("bash", {}, "") == "bash"


def test_probe_tracker_thresholds() -> None:
    spec = {"periodSeconds": 1, "failureThreshold": 3, "successThreshold": 2, "initialDelaySeconds": 5}
    readiness = ProbeTracker.start(READINESS, spec, started_at=100.0)
    assert not readiness.passed and not readiness.due(104.9) and readiness.due(105.0)
    assert readiness.record(True, "ok", 105) is False and not readiness.passed  # needs 2 successes
    readiness.record(True, "ok", 106)
    assert readiness.passed
    crossings = [readiness.record(False, "500", t) for t in (107, 108, 109, 110)]
    assert crossings == [False, False, True, False]  # crossing reported once, at the 3rd failure
    assert not readiness.passed
    assert ProbeTracker.start(LIVENESS, {}, 0).passed  # liveness starts out passing
    assert not ProbeTracker.start(STARTUP, {}, 0).passed


def _cs(name: str, state: dict, ready: bool = False) -> ContainerStatus:
    return ContainerStatus(name=name, image="i", state=state, ready=ready)


def test_pod_phase_by_restart_policy() -> None:
    done_ok = _cs("a", {"terminated": {"exitCode": 0}})
    done_bad = _cs("b", {"terminated": {"exitCode": 2}})
    running = _cs("c", {"running": {}})
    assert pod_phase("Never", False, [done_ok], running=True) == "Succeeded"
    assert pod_phase("Never", False, [done_ok, done_bad], running=True) == "Failed"
    assert pod_phase("Never", False, [done_bad, running], running=True) == "Running"  # not all finished yet
    assert pod_phase("Always", False, [running], running=True) == "Running"
    assert pod_phase("OnFailure", False, [running], running=False) == "Pending"
    assert pod_phase("Never", True, [running], running=False) == "Failed"  # an init container failed


def test_conditions_keep_transition_times_until_status_flips() -> None:
    ready = [_cs("a", {"running": {}}, ready=True)]
    first = pod_conditions("Running", True, ready, [], now="T1")
    again = pod_conditions("Running", True, ready, first, now="T2")
    assert {c["type"]: c["lastTransitionTime"] for c in again}["Ready"] == "T1"
    unready = pod_conditions("Running", True, [_cs("a", {"running": {}})], again, now="T3")
    ready_cond = {c["type"]: c for c in unready}["Ready"]
    assert ready_cond["status"] == "False" and ready_cond["lastTransitionTime"] == "T3"
    assert ready_cond["message"] == "containers with unready status: [a]"


def test_a_ready_condition_another_writer_flipped_is_a_disagreement() -> None:
    ready = pod_conditions("Running", True, [_cs("a", {"running": {}}, ready=True)], [], now="T1")
    ours = {"phase": "Running", "conditions": ready, "podIP": "127.32.0.5"}
    echoed = {**ours, "conditions": [{**c, "lastProbeTime": None} for c in ready]}  # the API's own rendering
    assert not disagrees(ours, echoed)
    # The node lifecycle controller after a missed heartbeat: Ready False, ContainersReady left True.
    marked = {**ours, "conditions": [{**c, "status": "False"} if c["type"] == "Ready" else c for c in ready]}
    assert disagrees(ours, marked)
    assert disagrees(ours, {**ours, "phase": "Pending"})
    assert not disagrees(ours, None)  # no copy from the watch yet: nothing to compare
    # Another writer's own conditions are theirs, and a terminal phase another writer set is never fought.
    gated = {**ours, "conditions": [*ready, {"type": "DisruptionTarget", "status": "True"}]}
    assert not disagrees(ours, gated)
    assert not disagrees(ours, {**ours, "phase": "Failed"})


def test_ip_allocator_is_unique_keeps_existing_and_skips_foreign_ips() -> None:
    ips = IPAllocator("127.2.0.0/29")  # 6 usable addresses
    kept = ips.claim("p0", "127.2.0.5")
    assert kept == "127.2.0.5"
    assert ips.claim("p1", "127.1.0.3") != "127.1.0.3"  # kwok's range is not ours
    taken = {kept, *(ips.claim(f"q{i}", None) for i in range(4))}
    assert len(taken) == 5 and all(ip.startswith("127.2.0.") for ip in taken)
    ips.release("p0")
    assert ips.claim("p2", "127.2.0.5") == "127.2.0.5"


class FakeKube:
    """Scripted API server for the agent: each list returns the next pod set; each watch raises 410 Gone."""

    def __init__(self, lists: list[list[dict]], stop) -> None:
        self.lists, self.stop, self.patches, self.watches = lists, stop, [], 0

    def list_pods(self, selector: str) -> tuple[list[dict], str]:
        if len(self.lists) == 1:
            self.stop.set()  # the last scripted list: let the loop end after it
        return self.lists.pop(0), str(10 + len(self.lists))

    def watch_pods(self, selector: str, resource_version: str, timeout_s: int):
        self.watches += 1
        raise WatchExpired("too old resource version")
        yield  # pragma: no cover - makes this a generator like the real one

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return None

    def patch_pod_status(self, namespace: str, name: str, uid: str, status: dict) -> bool:
        self.patches.append((name, status["phase"], status.get("podIP")))
        return True

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        pass


def _bound_pod(name: str, uid: str, ip: str | None = None) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns1", "uid": uid},
        "spec": {"nodeName": "gpu-h100-0", "containers": [{"name": "c", "image": "i", "command": ["sleep", "30"]}]},
        "status": {"podIP": ip} if ip else {},
    }


def test_agent_relists_after_410_and_stops_pods_that_vanished(tmp_path) -> None:
    import threading

    from hack.testenv.podagent.agent import Agent
    from hack.testenv.podagent.config import AgentConfig

    stop = threading.Event()
    first = [_bound_pod("a", "uid-a"), _bound_pod("b", "uid-b", ip="127.2.0.77")]
    second = [_bound_pod("b", "uid-b", ip="127.2.0.77"), _bound_pod("c", "uid-c")]
    kube = FakeKube([first, second], stop)
    cfg = AgentConfig(state_dir=tmp_path, base_env={"PATH": "/usr/bin:/bin"}, shims={})
    agent = Agent(kube, cfg, "127.2.0.0/16")  # type: ignore[arg-type]
    try:
        agent.watch_forever(stop)
        assert kube.watches == 2  # each list is followed by a watch; the first expired and forced the relist
        assert set(agent.workers) == {"uid-b", "uid-c"}  # a vanished, c appeared
        assert agent.ips.owner["127.2.0.77"] == "uid-b"  # b kept the IP it already had
        time.sleep(0.5)
        assert any(name == "c" and phase == "Running" for name, phase, _ in kube.patches)
    finally:
        agent.shutdown()
    assert not (tmp_path / "run" / "pod-pgids").exists() or not list((tmp_path / "run" / "pod-pgids").iterdir())
