"""The character sets and lengths of every field that becomes a path, a name, a label or a command argument.

Two reasons to be strict. A value that reaches the build script must be inert even before quoting (issue 13:
``pvc://models/x/$(touch /tmp/x)`` ran ``touch``), so paths and ids are limited to letters, digits and
``-_.`` with no segment starting with ``.`` (no ``..``) or ``-`` (no option injection). And a value that
becomes part of a child object must pass the API server's own check on that object, so admission refuses
what the Job, Deployment or PVC create would refuse later, where the user never sees it.

The regexes are RE2 (the API server's and CEL's engine; the offline validator uses the same library), use no
backslashes (CEL string literals would need them escaped) and are anchored with ``^...$``, which in RE2
matches only at the very end of the text, never before a trailing newline.
"""

from __future__ import annotations

from kvpilot.api.openapi import Rule

# One path segment: starts with a letter, digit or '_' (so never '.', '..' or an option such as '-x').
SEGMENT = "[A-Za-z0-9_][-A-Za-z0-9_.]*"
# A DNS-1123 label (claim names here), at most 253 characters as the PVC name allows.
CLAIM = "[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?"
HF_ID = "[A-Za-z0-9][-A-Za-z0-9_.]{0,95}"
S3_BUCKET = "[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]"
S3_SEGMENT = "[A-Za-z0-9_][-A-Za-z0-9_.=+]*"

SOURCE_REGEX = (
    f"^(hf://{HF_ID}/{HF_ID}|pvc://{CLAIM}(/{SEGMENT})*/?|s3://{S3_BUCKET}(/{S3_SEGMENT})*/?)$"
)
SOURCE_MESSAGE = (
    "must be hf://<org>/<name>, pvc://<claim>/<path> or s3://<bucket>/<prefix>; a path is made of segments of "
    "letters, digits, '-', '_' and '.' that do not start with '.' or '-' (no spaces, quotes or shell characters)"
)
DATASET_REGEX = f"^({HF_ID}(/{HF_ID})?|pvc://{CLAIM}(/{SEGMENT})*/?)$"
DATASET_MESSAGE = (
    "must be a Hugging Face dataset (<name> or <org>/<name>) or pvc://<claim>/<path>: letters, digits, '-', '_' "
    "and '.', each name or segment starting with a letter, digit or '_'"
)
REVISION_REGEX = "^[A-Za-z0-9_][-A-Za-z0-9_./]*$"
REVISION_MESSAGE = (
    "must be a commit, tag or branch: letters, digits, '-', '_', '.' and '/', starting with a letter, digit or '_'"
)
IMAGE_REGEX = "^[A-Za-z0-9][-A-Za-z0-9_./:@]*$"
IMAGE_MESSAGE = "must be an image reference such as nvcr.io/nvidia/tensorrt-llm/release:1.2.0 (no spaces or quotes)"

# Kubernetes label values and qualified names (label keys), as k8s.io/apimachinery validation defines them.
LABEL_VALUE_REGEX = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX = 63
QUALIFIED_NAME_REGEX = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LONG_PREFIX_REGEX = "^[^/]{254,}/"  # a qualified name's prefix is a DNS subdomain: at most 253 characters
LABEL_VALUE_MESSAGE = (
    "must be a valid label value: at most 63 characters, letters, digits, '-', '_' and '.', starting and ending "
    "with a letter or digit"
)
QUALIFIED_NAME_MESSAGE = (
    "must be a qualified name such as example.com/gpu-type: an optional DNS subdomain prefix (at most 253 "
    "characters) and '/', then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter "
    "or digit"
)


def matches(regex: str, message: str) -> Rule:
    """A pattern check whose error says what must hold (an OpenAPI ``pattern`` only echoes the regex)."""
    return Rule(f"self.matches('{regex}')", message)


def label_value_rule() -> Rule:
    return matches(LABEL_VALUE_REGEX, LABEL_VALUE_MESSAGE)


def qualified_name_cel(var: str) -> str:
    return f"{var}.matches('{QUALIFIED_NAME_REGEX}') && !{var}.matches('{LONG_PREFIX_REGEX}')"
