"""Pure translation of a pod's container spec into a local process launch.

Images are never pulled: a container's command runs on this host, with its mount paths rewritten to
local directories, `0.0.0.0` rewritten to the pod IP (pods share the host's network, so a pod only
owns its own 127.2.x.y address), and the image's TensorRT-LLM binaries mapped to shims that call kvsim.
Everything here is a function of its inputs, so it is unit-tested without a cluster.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# lookup(kind, namespace, name) -> the object as a dict, or None if it does not exist.
Lookup = Callable[[str, str, str], "dict | None"]


class ConfigError(Exception):
    """The container cannot start with what it references (the kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to spawn one container run as a local process."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    termination_log: str


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are substituted, undefined references stay
    verbatim, and `$$` is an escaped `$` (so `$$(VAR)` yields the literal `$(VAR)`)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


_FIELD_PATH = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_ref(pod: Mapping, path: str) -> str:
    """The value of a downward-API fieldRef such as `status.podIP` or `metadata.labels['app']`."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs", [])),
    }
    if path in simple:
        return simple[path]
    match = _FIELD_PATH.match(path)
    if match:
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    raise ConfigError(f"fieldRef.fieldPath {path!r} is not supported by the local kubelet")


def _key_from(lookup: Lookup, kind: str, namespace: str, ref: Mapping) -> str | None:
    """The value of key `ref.key` in ConfigMap/Secret `ref.name`; None when optional and missing."""
    obj = lookup(kind, namespace, ref.get("name", ""))
    optional = bool(ref.get("optional", False))
    if obj is None:
        if optional:
            return None
        raise ConfigError(f"{kind} {namespace}/{ref.get('name')} not found")
    data = object_data(kind, obj)
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"key {ref['key']!r} not found in {kind} {namespace}/{ref.get('name')}")
    return data[ref["key"]]


def object_data(kind: str, obj: Mapping) -> dict[str, str]:
    """A ConfigMap's or Secret's entries as text (Secret values are base64 on the wire)."""
    if kind == "Secret":
        merged = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("data") or {}).items()}
        merged.update(obj.get("stringData") or {})
        return merged
    merged = dict(obj.get("data") or {})
    merged.update({k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("binaryData") or {}).items()})
    return merged


def resolve_env(container: Mapping, pod: Mapping, lookup: Lookup) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order, each
    `value` expanded against the variables defined before it."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key not in source:
                continue
            ref = source[key]
            obj = lookup(kind, namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"envFrom {kind} {namespace}/{ref.get('name')} not found")
            env.update({prefix + k: v for k, v in object_data(kind, obj).items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand_vars(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = _key_from(lookup, "Secret", namespace, source["secretKeyRef"])
            if value is not None:
                env[name] = value
        elif "configMapKeyRef" in source:
            value = _key_from(lookup, "ConfigMap", namespace, source["configMapKeyRef"])
            if value is not None:
                env[name] = value
        else:
            raise ConfigError(f"env {name}: valueFrom {sorted(source)} is not supported by the local kubelet")
    return env


_PATH_CHAR = r"[\w.\-/]"


def path_rewriter(mounts: Sequence[tuple[str, str]]) -> Callable[[str], str]:
    """A function that rewrites container paths inside a string to their local counterparts.

    One regex pass with the longest mount path first, so `/engines/cache` wins over `/engines` and a
    rewritten local path is never rewritten again. A match must be a whole path component: `/data`
    matches `/data` and `/data/x` but not `/database` or `/srv/data`. A root mount (`/`) is ignored.
    """
    table = {path.rstrip("/"): local for path, local in mounts if path.rstrip("/")}
    if not table:
        return lambda text: text
    ordered = sorted(table, key=len, reverse=True)
    pattern = re.compile(rf"(?<!{_PATH_CHAR})(" + "|".join(re.escape(p) for p in ordered) + r")(?![\w.\-])")
    return lambda text: pattern.sub(lambda m: table[m.group(1)], text)


def bind_to_pod_ip(text: str, pod_ip: str) -> str:
    """`0.0.0.0` -> the pod IP: every pod shares this host, so "all interfaces" would collide."""
    return re.sub(r"(?<![\d.])0\.0\.0\.0(?![\d.])", pod_ip, text)


def resolve_program(argv0: str, shims: Mapping[str, str], path: str) -> str:
    """The local executable for an image's program: a shim for mapped names (trtllm-serve ->
    `kvsim trtllm-serve`), else the name as given, looked up on PATH when its image path does not
    exist here (`/usr/bin/python3` -> `python3`)."""
    name = os.path.basename(argv0)
    if name in shims:
        return shims[name]
    if os.path.isabs(argv0) and not os.path.exists(argv0):
        for directory in path.split(os.pathsep):
            candidate = os.path.join(directory, name)
            if os.access(candidate, os.X_OK):
                return candidate
    return argv0


def plan_launch(
    container: Mapping,
    pod: Mapping,
    mounts: Sequence[tuple[str, str]],
    base_env: Mapping[str, str],
    shims: Mapping[str, str],
    termination_log: str,
    default_cwd: str,
    lookup: Lookup,
) -> LaunchPlan:
    """Translate one container into a LaunchPlan. `mounts` are (container path, local path) pairs,
    already resolved from the pod's volumes; the termination message path is added here."""
    pod_ip = pod.get("status", {}).get("podIP", "")
    term_path = container.get("terminationMessagePath") or "/dev/termination-log"
    rewrite = path_rewriter([*mounts, (term_path, termination_log)])

    def local(text: str) -> str:
        return bind_to_pod_ip(rewrite(text), pod_ip) if pod_ip else rewrite(text)

    container_env = {k: local(v) for k, v in resolve_env(container, pod, lookup).items()}
    command = [expand_vars(str(a), container_env) for a in container.get("command") or []]
    args = [expand_vars(str(a), container_env) for a in container.get("args") or []]
    argv = [local(a) for a in command + args]
    if not argv:
        raise ConfigError(
            f"container {container.get('name')!r} (image {container.get('image')!r}) has neither command nor "
            "args; the local kubelet does not know image entrypoints, so give the command explicitly"
        )
    env = {**base_env, "HOSTNAME": pod["metadata"]["name"], **container_env}
    if "PATH" in container_env:  # an image PATH must not hide the shims and the venv
        env["PATH"] = f"{base_env.get('PATH', '')}{os.pathsep}{container_env['PATH']}"
    argv[0] = resolve_program(argv[0], shims, env.get("PATH", ""))
    cwd = local(container["workingDir"]) if container.get("workingDir") else default_cwd
    return LaunchPlan(argv=argv, env=env, cwd=cwd, termination_log=termination_log)
