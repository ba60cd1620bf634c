"""Materialise a pod's volumes as local directories, and map its containers' mounts onto them.

PVCs resolve to their bound PersistentVolume's hostPath (the e2e tests create hostPath PVs, so a
build Job and the serving pods share one engine directory exactly as they would share a real
volume); an unbound claim falls back to a per-claim directory. ConfigMaps and Secrets are written as
files once, at pod start (the kubelet refreshes them later; our pods are replaced on change instead).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from .podspec import ConfigError, Lookup, field_ref, object_data

log = logging.getLogger("localkubelet.volumes")


def _write_file(path: Path, content: str, mode: int | None) -> None:
    """Write one projected file (parents included), honouring an explicit item/default mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)


def _project_keys(kind: str, source: Mapping, namespace: str, target: Path, lookup: Lookup) -> None:
    """Write a ConfigMap/Secret volume source into `target`: all keys, or just `items` (key -> path)."""
    name = source.get("name") or source.get("secretName", "")
    obj = lookup(kind, namespace, name)
    if obj is None:
        if source.get("optional"):
            return
        raise ConfigError(f"{kind} {namespace}/{name} referenced by a volume not found")
    data = object_data(kind, obj)
    default_mode = source.get("defaultMode")
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ConfigError(f"key {item['key']!r} not found in {kind} {namespace}/{name}")
        _write_file(target / item["path"], data[item["key"]], item.get("mode", default_mode))


def _project_downward(source: Mapping, pod: Mapping, target: Path) -> None:
    """Write downwardAPI items: a fieldRef value, or `key="value"` lines for all labels/annotations."""
    for item in source.get("items") or []:
        path = item.get("fieldRef", {}).get("fieldPath", "")
        if path in ("metadata.labels", "metadata.annotations"):
            entries = pod["metadata"].get(path.split(".")[1]) or {}
            content = "\n".join(f'{k}="{v}"' for k, v in sorted(entries.items()))
        elif path:
            content = field_ref(pod, path)
        else:
            log.warning("downwardAPI item %s: only fieldRef is supported; writing it empty", item.get("path"))
            content = ""
        _write_file(target / item["path"], content, item.get("mode"))


def _claim_dir(claim: str, namespace: str, volumes_root: Path, lookup: Lookup) -> Path:
    """The local directory behind a PVC: its bound PV's hostPath/local path, else a per-claim dir."""
    pvc = lookup("PersistentVolumeClaim", namespace, claim)
    if pvc is None:
        raise ConfigError(f"PersistentVolumeClaim {namespace}/{claim} not found")
    volume_name = (pvc.get("spec") or {}).get("volumeName")
    pv = lookup("PersistentVolume", "", volume_name) if volume_name else None
    pv_spec = (pv or {}).get("spec") or {}
    for key in ("hostPath", "local"):
        if pv_spec.get(key, {}).get("path"):
            return Path(pv_spec[key]["path"])
    return volumes_root / namespace / claim


def materialize(pod: Mapping, pod_dir: Path, volumes_root: Path, lookup: Lookup) -> dict[str, Path]:
    """Create every volume of `pod` locally; returns volume name -> local path."""
    namespace = pod["metadata"]["namespace"]
    paths: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        target = pod_dir / "volumes" / name
        if "persistentVolumeClaim" in volume:
            target = _claim_dir(volume["persistentVolumeClaim"]["claimName"], namespace, volumes_root, lookup)
        elif "hostPath" in volume:
            target = Path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type") in ("File", "FileOrCreate", "Socket", "CharDevice", "BlockDevice"):
                paths[name] = target
                continue
        elif "configMap" in volume:
            _project_keys("ConfigMap", volume["configMap"], namespace, target, lookup)
        elif "secret" in volume:
            _project_keys("Secret", volume["secret"], namespace, target, lookup)
        elif "downwardAPI" in volume:
            _project_downward(volume["downwardAPI"], pod, target)
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                if "configMap" in source:
                    _project_keys("ConfigMap", source["configMap"], namespace, target, lookup)
                elif "secret" in source:
                    _project_keys("Secret", source["secret"], namespace, target, lookup)
                elif "downwardAPI" in source:
                    _project_downward(source["downwardAPI"], pod, target)
                else:
                    log.warning("volume %s: projected source %s is not supported; skipped", name, sorted(source))
        elif "emptyDir" not in volume:
            log.warning("volume %s: type %s is not supported; using an empty directory", name, sorted(volume))
        target.mkdir(parents=True, exist_ok=True)
        paths[name] = target
    return paths


def container_mounts(container: Mapping, volume_paths: Mapping[str, Path]) -> list[tuple[str, str]]:
    """(mountPath, local path) for each volumeMount of `container`, honouring subPath."""
    mounts: list[tuple[str, str]] = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volume_paths:
            raise ConfigError(
                f"container {container.get('name')!r}: volumeMount {mount['name']!r} names no volume of the pod"
            )
        local = volume_paths[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
            if not local.exists() and not Path(mount["mountPath"]).suffix:
                local.mkdir(parents=True, exist_ok=True)
        mounts.append((mount["mountPath"], os.fspath(local)))
    return mounts
