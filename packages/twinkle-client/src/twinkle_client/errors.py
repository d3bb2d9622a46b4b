"""Errors the client raises, one class per thing a user can do something about.

Every error from the server is a :class:`TwinkleServerError` carrying the HTTP ``status``, the
server's ``category`` (``user`` or ``server``) and its ``code``; the message is the server's own.
"""

from __future__ import annotations


class TwinkleClientError(Exception):
    """Base of every error this package raises."""


class TwinkleServerError(TwinkleClientError):
    """The server answered with an error.

    Attributes:
        status: The HTTP status (``None`` when the server could not be reached).
        category: ``'user'`` (fix the request) or ``'server'`` (retry or ask the operator).
        code: The server's error code (e.g. ``'NotFound'``).
        url: The URL that was called.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        category: str | None = None,
        code: str | None = None,
        url: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.category = category or ("server" if status is None or status >= 500 else "user")
        self.code = code
        self.url = url
        self.retry_after = retry_after


class BadRequestError(TwinkleServerError):
    """HTTP 400/409/413: the request is wrong; the message says how."""


class AuthenticationError(TwinkleServerError):
    """HTTP 401: the API key is missing or not valid."""


class PermissionDeniedError(TwinkleServerError):
    """HTTP 403: the API key may not touch this resource."""


class NotFoundError(TwinkleServerError):
    """HTTP 404: unknown adapter, run, checkpoint, dataset or operation."""


class GoneError(NotFoundError):
    """HTTP 410: the adapter (or session) existed and is gone: lost in a server restart, a
    worker's death, or finished. Not a fresh start: the message says what was lost; resume from
    the newest checkpoint. A :class:`NotFoundError`, so code catching that keeps working."""


class RateLimitError(TwinkleServerError):
    """HTTP 429, still refused after every retry."""


class ServerUnavailableError(TwinkleServerError):
    """The server could not be reached, timed out, or answered 5xx after every retry."""


class UnsupportedOperationError(TwinkleClientError, TypeError):
    """The remote API cannot do this (e.g. send Python code to the server); see the message."""


_BY_STATUS: dict[int, type[TwinkleServerError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: BadRequestError,
    410: GoneError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
}


def error_class(status: int) -> type[TwinkleServerError]:
    """The error class for an HTTP status."""
    if status >= 500:
        return ServerUnavailableError
    return _BY_STATUS.get(status, TwinkleServerError)


__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "GoneError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServerUnavailableError",
    "TwinkleClientError",
    "TwinkleServerError",
    "UnsupportedOperationError",
    "error_class",
]
