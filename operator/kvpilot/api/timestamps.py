"""The one spelling of a timestamp in status, Events and the API server's own fields (RFC 3339, UTC, seconds).

Kubernetes writes ``metav1.Time`` as ``2026-11-29T12:00:00Z``; kvpilot writes its status the same way and
reads the API server's (a pod's ``startTime``, a Job's ``completionTime``) back with the same format, so the
format is written once, here.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(when: datetime) -> str:
    """``when`` as Kubernetes writes a time (its offset is not converted: pass a UTC time)."""
    return when.strftime(RFC3339)


def parse_rfc3339(text: str, tz: tzinfo | None = None) -> datetime:
    """A Kubernetes time back to a datetime, naive unless ``tz`` is given (the zone of the ``now`` it is
    compared with); ValueError when ``text`` is not in that format."""
    return datetime.strptime(text, RFC3339).replace(tzinfo=tz)
