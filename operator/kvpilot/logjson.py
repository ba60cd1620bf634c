"""JSON log lines an operator can search: UTC times, the traceback, and which engine a line is about.

``kvpilot run --log-format json`` writes one object a line. A line logged while an engine's loop runs carries
that engine's ``namespace`` and ``name``, and once it has been planned its ``fingerprint`` and the tuner's last
``decision``: the loop sets them in a context variable (each asyncio task has its own copy, so 1,000 loops
do not mix their fields), and a call may name them itself with ``extra={...}``, which wins (the engine's
name as ``engine``: ``name`` is the logger's, a LogRecord attribute). kopf's own lines about an object carry
its ``k8s_ref``, which gives namespace and name too. Tracebacks
(``log.exception``) and ``stack_info`` are kept as fields, not dropped: a crash report without its traceback
cannot be acted on.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import datetime, timezone

ENGINE_FIELDS = ("namespace", "name", "fingerprint", "decision")
# The LogRecord attribute ``extra=`` sets for each field (``extra={"name": ...}`` is refused by logging).
RECORD_ATTRIBUTE = {"namespace": "namespace", "name": "engine", "fingerprint": "fingerprint", "decision": "decision"}
_engine: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("kvpilot_log_engine", default={})


def bind_engine(**fields: str | None) -> None:
    """Add engine fields (``namespace``, ``name``, ``fingerprint``, ``decision``) to every line this task
    logs from now on; a value of None or "" removes the field."""
    unknown = fields.keys() - set(ENGINE_FIELDS)
    if unknown:
        raise TypeError(f"bind_engine: unknown field(s) {sorted(unknown)}; known: {list(ENGINE_FIELDS)}")
    merged = dict(_engine.get())  # a new dict: the one a parent task holds is never changed
    for key, value in fields.items():
        if value:
            merged[key] = value
        else:
            merged.pop(key, None)
    _engine.set(merged)


def utc_millis(created: float) -> str:
    """A record's time as ISO 8601 in UTC with milliseconds: ``2026-11-29T12:00:00.123Z``."""
    stamp = datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the engine's fields when known, and the
    traceback (``exception``) and stack (``stack``) when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, str] = {"time": utc_millis(record.created), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        bound = _engine.get()
        ref = getattr(record, "k8s_ref", None)  # kopf's object loggers
        kopf_ref = {k: ref.get(k) for k in ("namespace", "name")} if isinstance(ref, dict) else {}
        for key in ENGINE_FIELDS:
            value = getattr(record, RECORD_ATTRIBUTE[key], None) or bound.get(key) or kopf_ref.get(key)
            if value:
                out[key] = str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out)
