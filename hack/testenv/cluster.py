"""Use the local control plane from Python (tests, the demo): bring it up, run kubectl and helm on it.

Standard library only, so any test or script can import it before anything else is installed:

    from hack.testenv import cluster               # from the repository root (tests, python -m hack.demo)
    kubeconfig = cluster.ensure_cluster_up()       # builds (cached) and starts what is missing
    cluster.kubectl("get", "nodes", "-o", "name")
    cluster.helm("install", "kvpilot", "charts/kvpilot", "-n", "kvpilot-system", "--create-namespace")
    token_kc = cluster.serviceaccount_kubeconfig("kvpilot-system", "kvpilot", tmp_path / "sa.kubeconfig")

The shell scripts next to this file stay the single source of truth for paths and versions; this
module asks lib.sh for them instead of repeating the cache-key logic.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent


class CommandError(RuntimeError):
    """A kubectl/helm/script invocation failed; the message carries the command and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv, self.returncode, self.stdout, self.stderr = list(argv), returncode, stdout, stderr
        shown = " ".join(argv[:8]) + (" ..." if len(argv) > 8 else "")
        super().__init__(f"`{shown}` exited {returncode}: {stderr.strip()[-2000:] or stdout.strip()[-2000:]}")


@functools.cache
def _lib_value(name: str) -> str:
    """A variable computed by lib.sh (TESTENV_BIN, TESTENV_DIR, ...), so the cache key lives in one place."""
    out = subprocess.run(
        ["bash", "-c", f'source "$1" && printf %s "${name}"', "lib.sh", os.fspath(HERE / "lib.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def bin_dir() -> Path:
    """The version-keyed cache directory holding etcd, kube-*, kwok, kubectl and helm."""
    return Path(_lib_value("TESTENV_BIN"))


def testenv_dir() -> Path:
    """Repo-local state: PKI, kubeconfig, pids, logs, pod directories (.testenv unless overridden)."""
    return Path(_lib_value("TESTENV_DIR"))


def kubeconfig_path() -> Path:
    """The admin kubeconfig written by cluster-up.sh (client certificate in system:masters)."""
    return testenv_dir() / "kubeconfig"


def settings() -> dict[str, str]:
    """What the running cluster was started with (.testenv/cluster.env): API_PORT, ETCD_PORT, ...,
    POD_CIDR (the local kubelet's pod IPs) and KWOK_CIDR (kwok's fake pod IPs). Defaults if absent."""
    values = {"POD_CIDR": "127.2.0.0/16", "KWOK_CIDR": "127.1.0.0/16"}
    try:
        lines = (testenv_dir() / "cluster.env").read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for subprocesses that talk to the cluster: KUBECONFIG, the cache bin dir first
    on PATH, and Helm's cache/config/data under .testenv (never the user's ~/.cache/helm)."""
    helm_home = testenv_dir() / "helm"
    result = dict(os.environ)
    result.update(
        {
            "KUBECONFIG": os.fspath(kubeconfig_path()),
            "PATH": f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
            "HELM_CACHE_HOME": os.fspath(helm_home / "cache"),
            "HELM_CONFIG_HOME": os.fspath(helm_home / "config"),
            "HELM_DATA_HOME": os.fspath(helm_home / "data"),
        }
    )
    result.update(extra or {})
    return result


def _run(argv: Sequence[str], stdin: str | None, timeout_s: float, check: bool, extra_env: Mapping[str, str] | None) -> str:
    """Run a tool against the cluster; returns stdout, raises CommandError on failure when `check`."""
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s, env=env(extra_env), check=False
    )
    if check and done.returncode != 0:
        raise CommandError(argv, done.returncode, done.stdout, done.stderr)
    return done.stdout


def kubectl(
    *args: str,
    stdin: str | None = None,
    timeout_s: float = 120,
    check: bool = True,
    kubeconfig: Path | None = None,
) -> str:
    """`kubectl --kubeconfig=<admin or given> ARGS...`; stdout as text. Pass YAML through `stdin` with `-f -`."""
    config = os.fspath(kubeconfig or kubeconfig_path())
    return _run([os.fspath(bin_dir() / "kubectl"), f"--kubeconfig={config}", *args], stdin, timeout_s, check, None)


# What kubectl wait says, and exits 1 at once, when the object's status.conditions is there but null (a CRD read
# just after its create): it would have waited had the field been absent. CI's cold machine hit it (cluster-up.sh).
NO_CONDITIONS_YET = ".status.conditions accessor error"


def wait_condition(resource: str, condition: str, namespace: str | None = None, timeout_s: float = 120,
                   selector: str | None = None) -> None:
    """`kubectl wait --for=condition=CONDITION RESOURCE [-l SELECTOR]`, retried while the object has no conditions
    yet, until ``timeout_s``; CommandError (naming the resource and condition) when it does not hold by then."""
    scope = (["-n", namespace] if namespace else []) + (["-l", selector] if selector else [])
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1, int(deadline - time.monotonic()))
        argv = ("wait", f"--for=condition={condition}", resource, *scope, f"--timeout={left}s")
        try:
            kubectl(*argv, timeout_s=left + 30)
            return
        except subprocess.TimeoutExpired as hung:
            raise CommandError(["kubectl", *argv], -1, "", f"kubectl did not return within {left + 30}s") from hung
        except CommandError as err:
            if NO_CONDITIONS_YET not in err.stderr or time.monotonic() >= deadline:
                raise
        time.sleep(1)


def helm(*args: str, stdin: str | None = None, timeout_s: float = 300, check: bool = True) -> str:
    """`helm --kubeconfig=<admin> ARGS...` with Helm's state under .testenv/helm; stdout as text."""
    argv = [os.fspath(bin_dir() / "helm"), f"--kubeconfig={kubeconfig_path()}", *args]
    return _run(argv, stdin, timeout_s, check, None)


def _pid_alive(name: str) -> bool:
    """Whether the component cluster-up.sh recorded under `name` still runs that component."""
    pidfile = testenv_dir() / "pids" / f"{name}.pid"
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return False
    return name in cmdline


def is_live() -> bool:
    """True when the API server answers /readyz with our kubeconfig, the local kubelet runs, and so does the
    LeaderWorkerSet controller unless TESTENV_LWS=0: its webhooks are registered before it starts, so a cluster-up
    that died between the two leaves every LeaderWorkerSet create refused, and the next caller must rerun
    cluster-up.sh (which starts only what is missing) rather than take that cluster as up."""
    if not kubeconfig_path().exists() or not (bin_dir() / "kubectl").exists():
        return False
    try:
        ok = kubectl("get", "--raw=/readyz", timeout_s=10, check=False).strip() == "ok"
    except subprocess.TimeoutExpired:
        return False
    lws_wanted = os.environ.get("TESTENV_LWS", "1") != "0"
    return ok and _pid_alive("localkubelet") and (not lws_wanted or _pid_alive("lws-controller"))


def _stream(argv: Sequence[str], what: str) -> None:
    """Run a script, forwarding its progress lines (stderr and stdout) to our stderr as they come."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, bufsize=1
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        sys.stderr.write(f"[{what}] {line}")
        sys.stderr.flush()
        tail = [*tail[-40:], line]
    if proc.wait() != 0:
        raise CommandError(argv, proc.returncode, "", "".join(tail))
    sys.stderr.write(f"[{what}] done in {time.monotonic() - start:.0f}s\n")


def ensure_cluster_up(build: bool = True) -> Path:
    """Make sure the local cluster runs and return its admin kubeconfig.

    Cheap when it already runs (one /readyz call). Otherwise runs build.sh (a cold build of the
    Kubernetes binaries takes minutes; cached binaries take milliseconds) and cluster-up.sh, which
    starts only what is missing, streaming their progress to stderr.
    """
    if is_live():
        return kubeconfig_path()
    if build:
        _stream([os.fspath(HERE / "build.sh")], "build")
    _stream([os.fspath(HERE / "cluster-up.sh")], "cluster-up")
    return kubeconfig_path()


def cluster_down() -> None:
    """Stop exactly what cluster-up.sh started and drop etcd's data."""
    _stream([os.fspath(HERE / "cluster-down.sh")], "cluster-down")


def pod_log(namespace: str, pod: str, container: str) -> str:
    """The output of a simulated pod's container, as captured by the local kubelet (`kubectl logs`
    cannot work: there is no kubelet server behind the fake nodes). Empty if it never ran."""
    path = testenv_dir() / "logs" / "pods" / namespace / pod / f"{container}.log"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def serviceaccount_kubeconfig(namespace: str, service_account: str, path: Path, duration: str = "24h") -> Path:
    """Write a kubeconfig that authenticates as `system:serviceaccount:<namespace>:<service_account>`
    with a token from the TokenRequest API, so a locally running process (the operator under test)
    gets exactly that ServiceAccount's RBAC: a missing permission fails instead of hiding."""
    token = kubectl("create", "token", service_account, "-n", namespace, f"--duration={duration}").strip()
    server = kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").strip()
    ca = testenv_dir() / "pki" / "ca.crt"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: testenv\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n"
        f"users:\n- name: {service_account}\n  user:\n    token: {token}\n"
        f"contexts:\n- name: {service_account}\n  context:\n    cluster: testenv\n    user: {service_account}\n"
        f"    namespace: {namespace}\n"
        f"current-context: {service_account}\n",
        encoding="utf-8",
    )
    path.chmod(0o600)
    return path
