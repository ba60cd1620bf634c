"""Pure checks the chart tests apply to rendered objects: Pod Security "restricted" and effective RBAC.

They are plain functions of manifests (no helm, no cluster), so test_chart_policies_selftest.py can
prove each one catches what it claims to catch on hand-made bad objects.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Manifest = dict[str, Any]

# Pod Security Standards, "restricted" profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# the only volume types it allows.
RESTRICTED_VOLUME_TYPES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
# The only capability "restricted" lets a container add back.
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# The "safe" sysctls of the baseline profile (restricted includes baseline).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)

POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"})


def pod_specs(objects: Iterable[Manifest]) -> list[tuple[str, Mapping[str, Any]]]:
    """(kind/name, pod spec) of every object that runs pods, including CronJobs and bare Pods."""
    found = []
    for obj in objects:
        kind, name = obj.get("kind"), obj.get("metadata", {}).get("name")
        if kind in POD_TEMPLATE_KINDS:
            found.append((f"{kind}/{name}", obj["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            found.append((f"{kind}/{name}", obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
        elif kind == "Pod":
            found.append((f"{kind}/{name}", obj["spec"]))
    return found


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """Every way this pod spec breaks Pod Security "restricted", plus our own rule of a read-only root.

    An empty list means it is admitted by a namespace labelled pod-security.kubernetes.io/enforce=restricted.
    """
    problems: list[str] = []
    pod_ctx = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"spec.{field} must not be true")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(
                f"volume {volume.get('name')!r} has type {sorted(kinds)}; restricted allows only {sorted(RESTRICTED_VOLUME_TYPES)}"
            )
    for sysctl in pod_ctx.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl.get('name')!r} is not in the safe set")
    if pod_ctx.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser must not be 0")
    if (pod_ctx.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    containers = [("containers", c) for c in pod.get("containers") or []]
    containers += [("initContainers", c) for c in pod.get("initContainers") or []]
    containers += [("ephemeralContainers", c) for c in pod.get("ephemeralContainers") or []]
    if not containers:
        problems.append("pod has no containers")
    for group, container in containers:
        where = f"{group}[{container.get('name')}]"
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            problems.append(f"{where}.securityContext.privileged must not be true")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation must be false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop must include ALL")
        extra = set(caps.get("add") or []) - RESTRICTED_ADDABLE_CAPABILITIES
        if extra:
            problems.append(f"{where}.securityContext.capabilities.add must not add {sorted(extra)}")
        run_as_non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
        if run_as_non_root is not True:
            problems.append(f"{where}: runAsNonRoot must be true (container or pod)")
        uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
        if uid == 0:
            problems.append(f"{where}: runAsUser must not be 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(
                f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (container or pod), got {seccomp!r}"
            )
        if ctx.get("procMount", "Default") != "Default":
            problems.append(f"{where}.securityContext.procMount must be Default")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where} must not use hostPort {port['hostPort']}")
        # Not a PSS rule, our own: the image must not be writable at run time.
        if ctx.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}.securityContext.readOnlyRootFilesystem must be true")
    return problems


# (apiGroup, resource) -> verbs; a scope is a namespace name, or None for cluster-wide.
Permissions = dict[tuple[str, str], frozenset[str]]
ScopedPermissions = dict[str | None, Permissions]


def _subject_matches(subject: Mapping[str, Any], sa_name: str, sa_namespace: str) -> bool:
    return (
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == sa_name
        and subject.get("namespace") == sa_namespace
    )


def effective_permissions(objects: Iterable[Manifest], sa_name: str, sa_namespace: str) -> ScopedPermissions:
    """What the ServiceAccount may do, by scope, from the (Cluster)Roles and bindings among `objects`.

    Follows bindings exactly as the RBAC authorizer does: a ClusterRoleBinding grants its ClusterRole
    everywhere; a RoleBinding grants its Role or ClusterRole in the binding's namespace only.
    Aggregated ClusterRoles are not expanded (the chart's aggregate roles are never bound to the operator).
    """
    objects = list(objects)
    cluster_roles = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ClusterRole"}
    roles = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects if o.get("kind") == "Role"}
    grants: dict[str | None, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(_subject_matches(s, sa_name, sa_namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        scope = None if kind == "ClusterRoleBinding" else binding["metadata"].get("namespace")
        if ref["kind"] == "ClusterRole":
            role = cluster_roles.get(ref["name"])
        else:
            role = roles.get((scope, ref["name"]))
        assert role is not None, (
            f"{kind}/{binding['metadata']['name']} refers to {ref['kind']}/{ref['name']}, which the chart does not render"
        )
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    grants[scope][(group, resource)].update(rule.get("verbs") or [])
    return {scope: {key: frozenset(verbs) for key, verbs in perms.items()} for scope, perms in grants.items()}


def wildcard_uses(role: Mapping[str, Any]) -> list[str]:
    """Each '*' in a (Cluster)Role's rules, as 'rule N field'."""
    found = []
    for index, rule in enumerate(role.get("rules") or []):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            if any("*" in str(value) for value in rule.get(field) or []):
                found.append(f"rule {index} {field}={rule[field]}")
    return found
