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


class Transient(ApiError):
    """Timeouts, 5xx, throttling, connection errors."""


def _reason(exc: ApiException | DynamicApiError) -> str:
    body = getattr(exc, "body", None) or ""
    try:
        return str(json.loads(body).get("message", body))
    except (ValueError, TypeError, AttributeError):
        return str(body or exc)


def convert(exc: BaseException) -> BaseException:
    status = getattr(exc, "status", None)
    if isinstance(exc, (ApiException, DynamicApiError)) and status is not None:
        message = _reason(exc)
        mapping: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 403: Forbidden, 422: Invalid}
        return mapping.get(int(status), Transient)(f"HTTP {status}: {message}")
    if isinstance(exc, ResourceNotFoundError):  # discovery: a kind this cluster does not serve (a CRD missing)
        return NotFound(f"the API server does not serve it (is its CRD installed?): {exc}")
    if isinstance(exc, (HTTPError, ConnectionError, TimeoutError)):
        return Transient(str(exc))
    return exc
