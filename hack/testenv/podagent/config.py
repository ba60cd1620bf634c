"""What every pod worker shares: the agent's settings, and the errors and labels that decide how a pod runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ImageMissing(Exception):
    """The image is not in the local store (the kubelet's ErrImageNeverPull under pullPolicy Never)."""


# Pods of a LeaderWorkerSet (multi-node engines) always run as local processes.
MULTINODE_LABEL = "leaderworkerset.sigs.k8s.io/name"


@dataclass(frozen=True)
class AgentConfig:
    """Settings shared by every worker."""

    state_dir: Path  # .testenv
    base_env: dict[str, str]  # PATH (shims, venv), HOME, LANG, ...
    shims: dict[str, str]  # program name -> shim executable
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 40.0
    tick_s: float = 0.25
    # The podman executable when containers run from their images (runner "podman" or "auto"); None runs
    # every container as a local process. require_image: a missing image is ErrImageNeverPull, not a fallback.
    podman: str | None = None
    require_image: bool = False
