"""Unit tests of the local kubelet's podman runner (hack/testenv/podagent/podman.py) and of the operator-image
runner's argument handling (hack/operatorimage.py): pure translation, no podman or cluster needed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hack.operatorimage import override_flags
from hack.testenv.podagent.podman import RUNTIME, apply_fs_group, mount_modes, plan_podman, security_flags
from hack.testenv.podagent.podspec import ConfigError


POD = {
    "metadata": {"name": "serve-0", "namespace": "ns1", "uid": "0c3e-uid"},
    "spec": {"nodeName": "gpu-h100-0", "securityContext": {"runAsUser": 10001, "fsGroup": 10001}},
    "status": {"podIP": "127.2.0.9", "hostIP": "127.0.0.1"},
}
NO_OBJECTS = lambda kind, namespace, name: None  # noqa: E731


def flag_values(argv: list[str], flag: str) -> list[str]:
    """Every value given to `flag` in argv (`--flag value` form)."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_command_replaces_the_entrypoint_and_args_follow_the_image() -> None:
    container = {
        "name": "server",
        "image": "ghcr.io/kvpilot/kvsim:0.1.0",
        "command": ["trtllm-serve", "/engines/$(FP)"],
        "args": ["--host", "0.0.0.0", "--port", "8000"],
        "env": [{"name": "FP", "value": "abc"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
    plan = plan_podman(container, POD, [("/engines", "/tmp/e", False)], "/tmp/term", NO_OBJECTS, "podman", "/x/.testenv")
    argv = plan.argv
    image_at = argv.index("ghcr.io/kvpilot/kvsim:0.1.0")
    assert json.loads(flag_values(argv, "--entrypoint")[0]) == ["trtllm-serve"]
    # $(FP) expanded, 0.0.0.0 bound to the pod IP (host network), args after the image.
    assert argv[image_at + 1 :] == ["/engines/abc", "--host", "127.2.0.9", "--port", "8000"]
    assert "POD_IP=127.2.0.9" in flag_values(argv, "--env")
    assert "/tmp/e:/engines:rw" in flag_values(argv, "--volume")
    assert "/tmp/term:/dev/termination-log:rw" in flag_values(argv, "--volume")
    assert flag_values(argv, "--network") == ["host"] and flag_values(argv, "--pull") == ["never"]
    assert "io.kvpilot.testenv=/x/.testenv" in flag_values(argv, "--label")
    # The machine's quirks: runc, and rlimits lowered explicitly.
    assert flag_values(argv, "--runtime") == [RUNTIME]
    assert "--ulimit=nofile=4096:4096" in argv


def test_args_only_keep_the_image_entrypoint() -> None:
    plan = plan_podman({"name": "c", "image": "img", "args": ["--help"]}, POD, [], "/t", NO_OBJECTS)
    assert "--entrypoint" not in plan.argv
    assert plan.argv[-2:] == ["img", "--help"]


def test_security_context_maps_to_podman_flags() -> None:
    container = {
        "name": "c",
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}, "runAsGroup": 20},
    }
    flags = security_flags(container, POD)
    assert flag_values(flags, "--user") == ["10001:20"]  # container's group, pod's user
    assert flag_values(flags, "--group-add") == ["10001"]  # fsGroup
    assert "--read-only" in flags and "--cap-drop=ALL" in flags
    assert "--read-only-tmpfs=false" in flags  # only the pod's volumes are writable, as under a kubelet
    assert flag_values(flags, "--security-opt") == ["no-new-privileges"]


def test_run_as_non_root_with_uid_zero_is_a_config_error() -> None:
    pod = {**POD, "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}}
    with pytest.raises(ConfigError, match="runAsNonRoot"):
        security_flags({"name": "c"}, pod)


def test_mount_modes_follow_read_only() -> None:
    container = {"volumeMounts": [{"name": "a", "mountPath": "/a", "readOnly": True}, {"name": "b", "mountPath": "/b"}]}
    assert mount_modes(container, [("/a", "/la"), ("/b", "/lb")]) == [("/a", "/la", True), ("/b", "/lb", False)]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to an arbitrary gid needs root")
def test_fs_group_owns_writable_volumes_but_not_host_paths(tmp_path: Path) -> None:
    cache, host = tmp_path / "cache", tmp_path / "host"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "f").write_text("x")
    host.mkdir()
    pod = {"spec": {"securityContext": {"fsGroup": 4242},
                    "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "c"}},
                                {"name": "host", "hostPath": {"path": str(host)}}]}}
    apply_fs_group(pod, {"cache": cache, "host": host})
    for path in (cache, cache / "sub", cache / "sub" / "f"):
        assert path.stat().st_gid == 4242
        assert path.stat().st_mode & stat.S_IWGRP
    assert (cache / "sub").stat().st_mode & stat.S_ISGID
    assert host.stat().st_gid != 4242


def test_override_flags_replaces_and_appends() -> None:
    args = ["run", "--all-namespaces", "--metrics-port", "8080", "--health-port", "8081"]
    out = override_flags(args, {"--health-port": "3000", "--resync-seconds": "3"})
    assert out == ["run", "--all-namespaces", "--metrics-port", "8080", "--health-port", "3000",
                   "--resync-seconds", "3"]
