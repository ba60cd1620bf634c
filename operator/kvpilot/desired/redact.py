"""Scrub token-like strings from text that leaves a pod: a failed build's log tail becomes
``status.build.message`` and an Event, both readable by anyone with the view role, while the build
itself handled HF_TOKEN and AWS keys (a stack trace or a verbose download can print them).

Redaction is best-effort and deliberately eager: a false positive costs a log fragment, a false
negative leaks a credential. Hex digests (engine fingerprints, model revisions) are kept: they are
what a reader needs to find the engine, and no credential kvpilot handles is pure hex.
"""

from __future__ import annotations

import re

MASK = "[REDACTED]"

_PATTERNS: tuple[re.Pattern[str], ...] = (
    # URL user-info (https://user:password@host)
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),
    # Authorization headers: "Bearer <token>", "Basic <b64>", "token <t>"
    re.compile(r"(?i)(?<=\bbearer\s)\s*[^\s'\",;]+"),
    re.compile(r"(?i)(?<=\bbasic\s)\s*[A-Za-z0-9+/=]{8,}"),
    # Hugging Face, GitHub, OpenAI-style and Slack tokens
    re.compile(r"\bhf_[A-Za-z0-9]{8,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    # AWS access key IDs
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b"),
    # JSON Web Tokens
    re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
)
# key=value / key: value where the key names a secret: the value is masked, the key kept.
_KEY_VALUE = re.compile(
    r"(?i)((?:^|[^A-Za-z0-9])[A-Za-z0-9_.-]*(?:token|secret|password|passwd|api[_-]?key|access[_-]?key|credentials?|"
    r"private[_-]?key)[\"']?\s*[=:]\s*[\"']?)([^\s\"',;}]+)"
)
# Any other long run of token characters that mixes letters and digits (base64/base62 secrets).
_GENERIC = re.compile(r"(?<![A-Za-z0-9_+=-])[A-Za-z0-9_+=-]{32,}(?![A-Za-z0-9_+=-])")
_HEX = re.compile(r"[0-9a-fA-F]+")


def _generic(match: re.Match[str]) -> str:
    text = match.group(0)
    has_digit = any(c.isdigit() for c in text)
    has_alpha = any(c.isalpha() for c in text)
    if _HEX.fullmatch(text) or not (has_digit and has_alpha):
        return text
    return MASK


def redact(text: str) -> str:
    """``text`` with credentials and token-like strings replaced by [REDACTED]."""
    for pattern in _PATTERNS:
        text = pattern.sub(MASK, text)
    text = _KEY_VALUE.sub(lambda m: m.group(1) + (m.group(2) if m.group(2) == MASK else MASK), text)
    return _GENERIC.sub(_generic, text)
