"""The built images (`make images`: ghcr.io/kvpilot/kvpilot and ghcr.io/kvpilot/kvsim), run under podman.

They tie the images to what runs them: the uid, ports, entrypoint and read-only root filesystem the chart
gives the operator, and the uid the operator gives kvsim pods. Skipped (saying so) only where the images
cannot exist: podman missing or the images not built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib

import pytest
import yaml
from chart_helpers import CHART_DIR, REPO_ROOT

from kvpilot.desired.pod_parts import KVSIM_UID

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
# The tag (and version label) hack/images/build.sh gave the images: KVPILOT_IMAGE_VERSION there and here.
TAG = os.environ.get("KVPILOT_IMAGE_VERSION") or VERSION
OPERATOR = f"ghcr.io/kvpilot/kvpilot:{TAG}"
KVSIM = f"ghcr.io/kvpilot/kvsim:{TAG}"
RUNTIME = "/usr/sbin/runc"  # crun refuses this machine's hybrid cgroups (hack/images/lib.sh)
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
BUILD_TOOLS = ("pip", "pip3", "gcc", "cc", "make", "git")  # apt-get is the base distribution's, as in python:3.11-slim


@pytest.fixture(scope="module")
def podman() -> str:
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("podman is not installed: `make images` installs it and builds the images")
    for image in (OPERATOR, KVSIM):
        if subprocess.run([binary, "image", "exists", image], check=False).returncode != 0:
            pytest.skip(f"{image} is not built: run `make images`")
    return binary


def inspect(podman: str, image: str) -> dict:
    out = subprocess.run([podman, "image", "inspect", image], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]


def run(podman: str, image: str, *args: str, user: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `image` as a hardened pod would: read-only root, /tmp the only writable path, no capabilities."""
    argv = [podman, "--runtime", RUNTIME, "run", "--rm", "--network", "host", "--pull", "never",
            "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", "--user", user,
            "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,mode=1777",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return subprocess.run([*argv, image, *args], capture_output=True, text=True, timeout=120, check=False)


def test_print_image_sizes(podman: str) -> None:
    """Figures for the README (printed, not asserted)."""
    for image in (OPERATOR, KVSIM):
        info = inspect(podman, image)
        print(f"{image}: {info['Size'] / 1e6:.0f} MB, base {info['Config']['Labels'].get('io.kvpilot.base', '?')}")
        assert info["Size"] > 0


def test_operator_runs_as_the_chart_uid_with_its_entrypoint_ports_and_labels(podman: str) -> None:
    config = inspect(podman, OPERATOR)["Config"]
    uid, _, gid = config["User"].partition(":")
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"] != 0
    assert int(gid) == VALUES["podSecurityContext"]["runAsGroup"]
    assert config["Entrypoint"] == ["kvpilot"]
    assert config["Cmd"] == ["run", "--all-namespaces"]
    assert {int(p.split("/")[0]) for p in config["ExposedPorts"]} == {VALUES["metrics"]["port"], VALUES["health"]["port"]}
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == TAG
    for key in ("title", "source", "licenses", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), key


def test_operator_starts_on_a_read_only_root_as_the_chart_runs_it(podman: str) -> None:
    user = f"{VALUES['podSecurityContext']['runAsUser']}:{VALUES['podSecurityContext']['runAsGroup']}"
    done = run(podman, OPERATOR, "--version", user=user)
    assert done.returncode == 0, done.stderr
    assert VERSION in done.stdout + done.stderr
    helped = run(podman, OPERATOR, "run", "--help", user=user)
    assert helped.returncode == 0 and "--health-port" in helped.stdout, helped.stderr


@pytest.mark.parametrize("image", [OPERATOR, KVSIM])
def test_no_installer_build_tool_or_source_tree_in_the_final_image(podman: str, image: str) -> None:
    probe = "for t in " + " ".join(BUILD_TOOLS) + '; do command -v "$t"; done; ls -d /src /wheels /build 2>/dev/null; true'
    done = run(podman, image, "-c", probe, user="65532:65532", entrypoint="sh")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"{image} still holds: {done.stdout.split()}"


def test_kvsim_runs_as_the_uid_the_operator_gives_its_pods(podman: str) -> None:
    config = inspect(podman, KVSIM)["Config"]
    assert config["User"] == f"{KVSIM_UID}:{KVSIM_UID}"
    assert config["Cmd"] == ["trtllm-serve", "--help"]


@pytest.mark.parametrize("program", ["trtllm-serve", "trtllm-build"])
def test_kvsim_entrypoints_work_on_a_read_only_root(podman: str, program: str) -> None:
    done = run(podman, KVSIM, program, "--help", user=f"{KVSIM_UID}:{KVSIM_UID}")
    assert done.returncode == 0, done.stderr
    assert f"usage: {program}" in done.stdout


def test_kvsim_default_command_is_trtllm_serve_help(podman: str) -> None:
    done = run(podman, KVSIM, user=f"{KVSIM_UID}:{KVSIM_UID}")
    assert done.returncode == 0, done.stderr
    assert "usage: trtllm-serve" in done.stdout


def _python(podman: str, image: str, code: str, user: str) -> list[str]:
    done = run(podman, image, "-c", code, user=user, entrypoint="python3")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


# What each image can import, and whether a `kvsim` program is on its PATH.
PROBE = ("import importlib.util as u, shutil; "
         "print(*[u.find_spec(m) is not None for m in ('kvpilot', 'kvsim', 'kvsim.engine', 'kvsim.serve', "
         "'kvsim.trtllm', 'kvsim.cli')], shutil.which('kvsim') is not None)")


def test_operator_image_holds_kvsim_only_as_the_library_the_operator_imports(podman: str) -> None:
    """kvsim is in the operator image as the tuner's what-if model; its server, stand-ins and CLI are not."""
    user = f"{VALUES['podSecurityContext']['runAsUser']}:{VALUES['podSecurityContext']['runAsGroup']}"
    has = dict(zip(["kvpilot", "kvsim", "engine", "serve", "trtllm", "cli", "program"],
                   _python(podman, OPERATOR, PROBE, user)))
    assert has == {"kvpilot": "True", "kvsim": "True", "engine": "True", "serve": "False", "trtllm": "False",
                   "cli": "False", "program": "False"}
    imported = _python(podman, OPERATOR, "import kvpilot.operator, kvpilot.autotune.whatif; print('ok')", user)
    assert imported == ["ok"]
    # Nor kvpilot's own benchmark (Dockerfile, KVPILOT_NOT_IN_OPERATOR): `kvpilot bench` says where it lives.
    bench = _python(podman, OPERATOR, "import importlib.util as u; print(u.find_spec('kvpilot.bench') is None)", user)
    assert bench == ["True"]


def test_kvsim_image_holds_kvsim_and_its_server_not_the_operator(podman: str) -> None:
    has = dict(zip(["kvpilot", "kvsim", "engine", "serve", "trtllm", "cli", "program"],
                   _python(podman, KVSIM, PROBE, f"{KVSIM_UID}:{KVSIM_UID}")))
    assert has == {"kvpilot": "False", "kvsim": "True", "engine": "True", "serve": "True", "trtllm": "True",
                   "cli": "True", "program": "True"}
    # `trtllm-serve --help` answers before the server's modules load: import them, dependencies and all.
    imported = _python(podman, KVSIM, "import kvsim.serve.app, kvsim.trtllm.build; print('ok')",
                       f"{KVSIM_UID}:{KVSIM_UID}")
    assert imported == ["ok"]
