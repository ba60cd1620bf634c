"""The operator-wide settings a plan depends on (``kvpilot run``'s flags that shape what it renders).

Its own module: the loops, the observers, the handlers and the benchmark hold them without importing the
plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot import __version__
from kvpilot.api.metrics_url import MetricsPin
from kvpilot.trtllm.release import DEFAULT_IMAGE


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings the plan depends on."""

    kvsim_image: str = f"ghcr.io/kvpilot/kvsim:{__version__}"
    default_image: str = DEFAULT_IMAGE
    metrics_pins: tuple[MetricsPin, ...] = ()  # --resolve: metrics hosts the administrator pinned
