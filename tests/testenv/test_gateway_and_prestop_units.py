"""The load generator's gateway (hack/gateway.py) routes exactly as the endpoints controller publishes
ready endpoints, and the local kubelet runs preStop hooks before SIGTERM: the two halves of retunes that
lose no request. Pure parts, no cluster."""

from __future__ import annotations

import time

import pytest

from hack.gateway import ready_addresses
from hack.testenv.podagent.lifecycle import pre_stop_action, run_pre_stop_hooks


SERVICE = {"metadata": {"name": "loop", "namespace": "ns"},
           "spec": {"selector": {"app": "loop"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}


def pod(name: str, ip: str | None = "127.28.0.5", ready: bool = True, labels: dict | None = None,
        deleting: bool = False, phase: str = "Running", ns: str = "ns", port_name: str = "http") -> dict:
    meta = {"name": name, "namespace": ns, "labels": {"app": "loop"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "server", "ports": [{"name": port_name, "containerPort": 8000}]}]},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_ready_selected_pods_are_endpoints() -> None:
    pods = [pod("a", "127.28.0.5"), pod("b", "127.28.0.6")]
    assert ready_addresses(SERVICE, pods, "http") == ["127.28.0.5:8000", "127.28.0.6:8000"]


@pytest.mark.parametrize("excluded", [
    pod("not-ready", ready=False),
    pod("terminating", deleting=True),  # a retune's old pod: out of rotation as soon as it is deleted
    pod("no-ip", ip=None),
    pod("other-labels", labels={"app": "other"}),
    pod("other-namespace", ns="elsewhere"),
    pod("finished", phase="Succeeded"),
    pod("no-such-port", port_name="metrics"),
])
def test_pods_the_endpoints_controller_would_not_publish_as_ready(excluded: dict) -> None:
    assert ready_addresses(SERVICE, [pod("a", "127.28.0.9"), excluded], "http") == ["127.28.0.9:8000"]


def test_numeric_target_ports_and_services_without_selectors() -> None:
    numeric = {**SERVICE, "spec": {**SERVICE["spec"], "ports": [{"name": "http", "port": 80, "targetPort": 9000}]}}
    assert ready_addresses(numeric, [pod("a")], "http") == ["127.28.0.5:9000"]
    no_selector = {**SERVICE, "spec": {"ports": SERVICE["spec"]["ports"]}}
    assert ready_addresses(no_selector, [pod("a")], "http") == []
    publish = {**SERVICE, "spec": {**SERVICE["spec"], "publishNotReadyAddresses": True}}
    assert ready_addresses(publish, [pod("a", ready=False)], "http") == ["127.28.0.5:8000"]


def test_pre_stop_actions() -> None:
    assert pre_stop_action({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}) == ("exec", ["sleep", "5"])
    assert pre_stop_action({"lifecycle": {"preStop": {"sleep": {"seconds": 3}}}}) == ("sleep", 3.0)
    assert pre_stop_action({"name": "x"}) is None
    assert pre_stop_action({"name": "x", "lifecycle": {"preStop": {"httpGet": {"path": "/"}}}}) is None


def test_pre_stop_hooks_run_in_parallel_and_consume_the_grace_period() -> None:
    containers = [{"name": "a", "lifecycle": {"preStop": {"exec": {"command": ["sleep", "0.6"]}}}},
                  {"name": "b", "lifecycle": {"preStop": {"sleep": {"seconds": 0.6}}}}]
    t0 = time.monotonic()
    left = run_pre_stop_hooks(containers, 10)
    took = time.monotonic() - t0
    assert 0.5 < took < 1.5 and 8.4 < left < 9.5
    t0 = time.monotonic()
    assert run_pre_stop_hooks([{"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 30}}}}], 0.3) == 0.0
    assert time.monotonic() - t0 < 1.0  # the grace period bounds the hook
