"""preStop hooks, as the kubelet runs them before it stops a container of a deleted pod.

Supported: ``sleep`` (the native action) and ``exec`` run as a local process (the local kubelet has no
container to exec into; the serving pods' hook is ``sleep N``, which behaves the same). httpGet hooks are
not supported and are skipped with a log line. Hooks run in parallel, within the pod's grace period, which
they consume: SIGTERM follows when they end or the grace period is spent (the kubelet's order).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

log = logging.getLogger("podagent")


def pre_stop_action(container: Mapping) -> tuple[str, object] | None:
    """("sleep", seconds) or ("exec", argv) for the container's preStop hook, or None."""
    hook = ((container.get("lifecycle") or {}).get("preStop")) or {}
    if "sleep" in hook:
        return "sleep", float(hook["sleep"].get("seconds", 0))
    if "exec" in hook and hook["exec"].get("command"):
        return "exec", [str(a) for a in hook["exec"]["command"]]
    if hook:
        log.warning("preStop hook %s of container %s is not supported by the local kubelet; skipped",
                    sorted(hook), container.get("name"))
    return None


def _run(name: str, action: tuple[str, object], deadline: float, env: Mapping[str, str] | None,
         exec_prefix: Sequence[str] = ()) -> None:
    kind, what = action
    budget = max(0.0, deadline - time.monotonic())
    if kind == "sleep":
        time.sleep(min(float(what), budget))  # type: ignore[arg-type]
        return
    try:
        argv = [*exec_prefix, *what]  # type: ignore[misc]
        subprocess.run(argv, timeout=budget, env=dict(env) if env else None,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("preStop hook of container %s: %s", name, exc)


def run_pre_stop_hooks(containers: Sequence[Mapping], grace_s: float,
                       env: Mapping[str, str] | None = None,
                       exec_prefixes: Mapping[str, Sequence[str]] | None = None) -> float:
    """Run the hooks of ``containers`` in parallel within ``grace_s``; returns the grace left. An exec hook runs
    inside its container (``exec_prefixes[name]``, e.g. ``podman exec <id>``) where the container is a real one."""
    start = time.monotonic()
    deadline = start + grace_s
    threads = []
    for container in containers:
        action = pre_stop_action(container)
        if action is not None:
            prefix = (exec_prefixes or {}).get(str(container.get("name")), ())
            t = threading.Thread(target=_run, args=(container.get("name"), action, deadline, env, prefix),
                                 daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return max(0.0, grace_s - (time.monotonic() - start))
