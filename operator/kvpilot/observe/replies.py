"""The replies of serving pods and Prometheus servers, as untrusted bytes: read within a bound, decoded and parsed
into samples without raising (observe/scrape.py keeps what they say; observe/prometheus.py queries)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvpilot.trtllm.metrics import (
    IterationSample,
    LatencySnapshot,
    MetricsRejected,
    parse_iteration_stats,
    parse_prometheus,
)

MAX_BODY_BYTES = 8 * 2**20  # what a Prometheus server may answer (observe/prometheus.py): 50,000 samples
# What a serving pod may answer. trtllm-serve keeps at most iter_stats_max_iterations iterations (1000 by default;
# kvpilot renders no other value), and kvsim's 1000 iterations at max_batch_size 2048 measure 954,068 bytes
# (TensorRT backend) and 1,077,202 bytes (PyTorch): docs/faults.md. 2 MiB is twice that; a bigger reply is not
# trtllm-serve's, and is refused before it is parsed (an 8 MiB reply parsed every second cost 17% of a core).
POD_REPLY_BYTES = 2 * 2**20


async def read_bounded(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, refusing one above ``limit`` bytes without buffering it (a declared Content-Length above
    it is refused before a byte is read). StreamReader.read(n) returns what has arrived, not n bytes: read until
    EOF."""
    declared = getattr(resp, "content_length", None)
    if isinstance(declared, int) and declared > limit:
        raise MetricsRejected("size", f"reply larger than {limit} bytes ({declared} declared)")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = await resp.content.read(2**16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise MetricsRejected("size", f"reply larger than {limit} bytes")
        chunks.append(chunk)


def decode_json(body: bytes) -> Any:
    """JSON from an untrusted body: any failure (bad UTF-8, syntax, nesting deep enough to exhaust the
    recursion limit, NaN/Infinity literals) is a rejection."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except MetricsRejected:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise MetricsRejected("syntax", f"not JSON: {str(exc)[:120]}") from None


def _reject_constant(name: str) -> Any:
    raise MetricsRejected("value", f"JSON constant {name} is not a number trtllm-serve sends")


@dataclass(frozen=True)
class ParsedReply:
    """What one pod's replies said: its samples and latency snapshot, or why they were refused."""

    samples: list[IterationSample] = field(default_factory=list)
    snap: LatencySnapshot | None = None
    rejected: MetricsRejected | None = None


def parse_replies(stats: bytes, prom: bytes | None, wall: float) -> ParsedReply:
    """Parse a pod's /metrics and /prometheus/metrics replies (untrusted bytes). Touches no shared state, so it
    runs in a worker thread; a malformed reply, or a parser bug, is a refusal, never an exception."""
    try:
        samples = parse_iteration_stats(decode_json(stats), wall)
        snap = None
        if prom is not None:
            try:
                text = prom.decode("utf-8")
            except UnicodeDecodeError:
                raise MetricsRejected("syntax", "/prometheus/metrics is not UTF-8") from None
            _sample, snap = parse_prometheus(text, wall)
    except MetricsRejected as exc:
        return ParsedReply(rejected=exc)
    except Exception as exc:  # noqa: BLE001 — a parser bug must cost one sample, not the engine's loop
        return ParsedReply(rejected=MetricsRejected("error", f"{type(exc).__name__}: {str(exc)[:200]}"))
    return ParsedReply(samples, snap)
