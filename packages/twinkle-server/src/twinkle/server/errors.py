"""Errors a service raises, each with the HTTP status and Tinker error category it maps to."""

from __future__ import annotations


class ServiceError(Exception):
    """A request failed; ``status`` is its HTTP status, ``category`` Tinker's error category."""

    status: int = 500
    category: str = "server"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_dict(self) -> dict:
        return {"error": self.message, "category": self.category, "code": type(self).__name__}


class BadRequest(ServiceError):
    status, category = 400, "user"


class Unauthorized(ServiceError):
    status, category = 401, "user"


class Forbidden(ServiceError):
    status, category = 403, "user"


class NotFound(ServiceError):
    status, category = 404, "user"


class Conflict(ServiceError):
    status, category = 409, "user"


class Gone(ServiceError):
    """The session was finished: the Tinker SDK stops heartbeating on 410."""

    status, category = 410, "user"


class PayloadTooLarge(ServiceError):
    status, category = 413, "user"


class RateLimited(ServiceError):
    """Over a rate limit: retry after ``retry_after`` seconds (HTTP 429, Tinker ``paused_rate_limit``)."""

    status, category = 429, "user"


class AtCapacity(ServiceError):
    """No room for another adapter (``max_loras``): HTTP 503, Tinker ``paused_capacity``."""

    status, category = 503, "server"


def from_exception(exc: BaseException) -> ServiceError:
    """Map library exceptions to service errors: user mistakes are 4xx, the rest 5xx."""
    if isinstance(exc, ServiceError):
        return exc
    status = getattr(exc, "status_code", None)
    if status in _BY_STATUS:  # twinkle.server.state errors and auth errors carry their status
        return _BY_STATUS[status](str(getattr(exc, "detail", None) or exc))
    if isinstance(exc, (ValueError, TypeError)):
        return BadRequest(str(exc))
    if isinstance(exc, (FileNotFoundError, KeyError)):
        return NotFound(str(exc).strip("'\""))
    if isinstance(exc, RuntimeError):
        return BadRequest(str(exc))
    return ServiceError(f"{type(exc).__name__}: {exc}")


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
}
