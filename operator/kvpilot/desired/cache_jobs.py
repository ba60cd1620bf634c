"""One-off Jobs that list or prune the engines on a cache claim (``kvpilot cache ls|prune``).

The operator never deletes a published engine: an engine directory is cheap to keep and costly to rebuild,
and only the user knows which old engines a rollback may still want (issue 13: the cache is a lifecycle,
not a pile). These Jobs let the user look and prune on purpose. They are rendered, not run: the user reads
them and pipes them to ``kubectl apply -f -``, then reads the result with ``kubectl logs``.

A prune deletes only directories that look like published engines (a 64-hex-digit fingerprint with its
``kvpilot-engine.json``) whose manifest is older than ``min_age_minutes``, so an engine published while the
Job runs is never taken. Fingerprints are checked here and quoted in the script: nothing typed reaches bash
as code.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

from kvpilot.desired import labels as L
from kvpilot.trtllm.build import CACHE_MOUNT, MANIFEST

FINGERPRINT = re.compile(r"[0-9a-f]{64}\Z")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
DEFAULT_IMAGE = "busybox:1.37"


class CacheJobError(ValueError):
    """A flag value the Job cannot be rendered with; the message names the flag."""


def _check(claim: str, namespace: str, keep: tuple[str, ...]) -> None:
    if not DNS1123_LABEL.match(claim):
        raise CacheJobError(f"--claim {claim!r}: must be a claim name (a DNS-1123 label of at most 63 characters)")
    if not DNS1123_LABEL.match(namespace):
        raise CacheJobError(f"--namespace {namespace!r}: must be a DNS-1123 label of at most 63 characters")
    for fp in keep:
        if not FINGERPRINT.match(fp):
            raise CacheJobError(f"--keep {fp[:80]!r}: must be a fingerprint (64 lower-case hex digits), as in "
                                "status.engine.fingerprint")


def list_script() -> str:
    """Every published engine: fingerprint, size, manifest; then the staging and download directories."""
    return "\n".join([
        "set -eu",
        f"cd {CACHE_MOUNT}",
        "for d in */; do",
        '  d="${d%/}"',
        f'  if [ -f "$d/{MANIFEST}" ]; then',
        f'    printf \'%s\\t%s\\t%s\\n\' "$d" "$(du -sh -- "$d" | cut -f1)" "$(cat -- "$d/{MANIFEST}")"',
        "  fi",
        "done",
        "for d in .staging .models; do [ -d \"$d\" ] && printf '%s\\t%s\\n' \"$d\" \"$(du -sh -- \"$d\" | cut -f1)\"; done",
        "true",
    ]) + "\n"


def prune_script(keep: tuple[str, ...], min_age_minutes: int, dry_run: bool, downloads: bool) -> str:
    """Deletes every published engine not in ``keep`` (and, with ``downloads``, the downloaded checkpoints)."""
    kept = shlex.quote(" " + " ".join(keep) + " ")
    delete = 'echo "would delete $d"' if dry_run else 'rm -rf -- "$d" && echo "deleted $d"'
    lines = [
        "set -eu",
        f"cd {CACHE_MOUNT}",
        f"keep={kept}",
        "for d in */; do",
        '  d="${d%/}"',
        '  case "$d" in *[!0-9a-f]*) continue ;; esac',
        '  [ "${#d}" -eq 64 ] || continue',
        f'  [ -f "$d/{MANIFEST}" ] || continue',
        '  case "$keep" in *" $d "*) echo "keep $d"; continue ;; esac',
        f'  if [ -z "$(find "$d/{MANIFEST}" -mmin +{int(min_age_minutes)})" ]; then echo "too recent $d"; continue; fi',
        f"  {delete}",
        "done",
    ]
    if downloads:
        lines.append('echo "would delete .models"' if dry_run else 'rm -rf -- .models && echo "deleted .models"')
    return "\n".join(lines) + "\n"


def cache_job(claim: str, namespace: str, action: str, script: str, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """A Job that mounts the claim (read-only to list) and runs ``script``; it deletes itself after an hour."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:8]
    read_only = action == "ls"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"kvpilot-cache-{action}-{digest}",
            "namespace": namespace,
            "labels": {**L.MANAGED_BY, L.COMPONENT_LABEL: f"cache-{action}", "serving.kvpilot.io/claim": claim},
        },
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [{
                        "name": action,
                        "image": image,
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "engines", "mountPath": CACHE_MOUNT, "readOnly": read_only}],
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }],
                    "volumes": [{"name": "engines",
                                 "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}],
                },
            },
        },
    }


def ls_job(claim: str, namespace: str, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    _check(claim, namespace, ())
    return cache_job(claim, namespace, "ls", list_script(), image)


def prune_job(claim: str, namespace: str, keep: tuple[str, ...], min_age_minutes: int = 60, dry_run: bool = False,
              downloads: bool = False, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    _check(claim, namespace, keep)
    if min_age_minutes < 0:
        raise CacheJobError(f"--min-age-minutes {min_age_minutes}: must be >= 0")
    return cache_job(claim, namespace, "prune", prune_script(keep, min_age_minutes, dry_run, downloads), image)

