"""Objects a plan asks to create once and never reads back (a multi-node engine's SSH Secret)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CreateOnce:
    """An object to create when absent; ``render`` builds it only when it is created (k8s/writes.py)."""

    kind: str
    namespace: str
    name: str
    render: Callable[[], dict[str, Any]]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"
