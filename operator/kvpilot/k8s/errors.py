"""Domain errors for API-server failures; ``convert`` is the single place client exceptions are mapped."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError
from urllib3.exceptions import HTTPError


class ApiError(Exception):
    """An API-server call failed."""


class NotFound(ApiError):
    """The object does not exist."""


class Conflict(ApiError):
    """Already exists, or a resourceVersion conflict."""


class Forbidden(ApiError):
    """RBAC denied the call: retrying will not help until someone fixes the Role."""


class Invalid(ApiError):
    """The API server rejected the object (a bug in kvpilot's rendering, or a webhook)."""


class Rejected(ApiError):
    """Another refusal the API server would repeat: a 4xx other than those above (not a timeout or throttling),
    or a 500 whose message names an invalid object (server-side apply answers 500 "failed to create typed patch
    object ... duplicate entries for key" for a list with two items of one key: issue 22)."""


class NameConflict(ApiError):
    """An object of the name kvpilot would write exists and is not this engine's (issue 22): it is neither
    modified nor adopted. ``kind``/``namespace``/``name`` name it; ``holder`` says whose it is."""

    def __init__(self, kind: str, namespace: str, name: str, holder: str):
        self.kind, self.namespace, self.name, self.holder = kind, namespace, name, holder
        super().__init__(f"{kind} {namespace}/{name} exists and {holder}; kvpilot neither changes nor adopts it "
                         f"(delete or rename it, or give the InferenceEngine another name)")


class Transient(ApiError):
    """Timeouts, 5xx, throttling, connection errors."""


# Permanent: the same request gets the same answer, so the loop backs off long (loop.backoff_seconds).
PERMANENT_ERRORS: tuple[type[ApiError], ...] = (Forbidden, Invalid, Rejected, NameConflict)
# Words of a 500 that is about the object sent, not the server's health.
_INVALID_OBJECT_500 = ("failed to create typed patch object", "duplicate entries for key", " is invalid")


def _reason(exc: ApiException | DynamicApiError) -> str:
    body = getattr(exc, "body", None) or ""
    try:
        return str(json.loads(body).get("message", body))
    except (ValueError, TypeError, AttributeError):
        return str(body or exc)


def _by_status(status: int, message: str) -> type[ApiError]:
    mapping: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 403: Forbidden, 422: Invalid}
    if status in mapping:
        return mapping[status]
    if 400 <= status < 500 and status not in (408, 429):
        return Rejected
    if status == 500 and any(words in message for words in _INVALID_OBJECT_500):
        return Rejected
    return Transient


def convert(exc: BaseException) -> BaseException:
    status = getattr(exc, "status", None)
    if isinstance(exc, (ApiException, DynamicApiError)) and status is not None:
        message = _reason(exc)
        return _by_status(int(status), message)(f"HTTP {status}: {message}")
    if isinstance(exc, ResourceNotFoundError):  # discovery: a kind this cluster does not serve (a CRD missing)
        return NotFound(f"the API server does not serve it (is its CRD installed?): {exc}")
    if isinstance(exc, (HTTPError, ConnectionError, TimeoutError)):
        return Transient(str(exc))
    return exc
