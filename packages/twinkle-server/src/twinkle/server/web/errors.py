"""Errors a service raises, each with the HTTP status and Tinker error category it maps to.

One hierarchy: the state layer's errors (``twinkle.server.state.errors``) and the auth error are
subclasses of these. :func:`from_exception` is the single mapping from any exception: a 4xx only
for a mistake the caller made and something checked explicitly (a :class:`ServiceError`, a
``twinkle.errors`` error, a pydantic ``ValidationError``); anything else is the server's fault.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping

from pydantic import ValidationError

from twinkle._logging import get_logger
from twinkle.errors import (
    AdapterCapacityError,
    PathForbiddenError,
    PathNotFoundError,
    TwinkleError,
    UnknownAdapterError,
)
from twinkle.server.web.request_ids import current_request_id, new_request_id

logger = get_logger(__name__)

OUT_OF_MEMORY_RETRY_S = 5.0
#: Seconds a client waits when no adapter slot is free (all resident adapters busy).
ADAPTER_CAPACITY_RETRY_S = 1.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
RETRY_LATER = "retry later"
#: The shape of the ids the model service gives adapters on the shared model (``"a"`` and 16 hex
#: digits of a hash of owner and name): a tenant never reads one, its own or another's.
INTERNAL_ADAPTER_ID = re.compile(r"\ba[0-9a-f]{16}\b")
OTHER_ADAPTER = "<another adapter>"
#: Exceptions meaning the client went away before its answer (Starlette's body reader, Ray's
#: cancelled task or Serve request): nothing failed on the server's side.
_CLIENT_GONE = frozenset({"ClientDisconnect", "TaskCancelledError", "RequestCancelledError"})


class ServiceError(Exception):
    """A request failed; ``status`` is its HTTP status, ``category`` Tinker's error category.

    ``status_code`` is the same status under the name the state layer and Starlette use.
    ``request_id`` names the request in the server's log; a 5xx always has one.
    """

    status: int = 500
    status_code: int = 500
    category: str = "server"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.status_code = cls.status

    def __init__(
        self, message: str, *, retry_after: float | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.request_id = request_id

    def to_dict(self) -> dict:
        """The JSON error body: ``error``, ``category``, ``code`` and, when known, ``request_id``
        and ``retry_after``; ``detail`` repeats the message under FastAPI's name, which the tinker
        CLI prints. ``retry_after`` is in exact seconds: the ``Retry-After`` header can only say
        whole ones, and a client waiting a whole second for a 0.2 s gap gets less than its rate
        limit allows."""
        body = {
            "error": self.message,
            "detail": self.message,
            "category": self.category,
            "code": self.code,
        }
        if self.request_id:
            body["request_id"] = self.request_id
        if self.retry_after is not None:
            body["retry_after"] = round(self.retry_after, 3)
        return body

    @property
    def code(self) -> str:
        """The name of the class in this module it is (``NotFound`` for the state's NotFoundError)."""
        return next(c.__name__ for c in type(self).__mro__ if c.__module__ == __name__)


class BadRequest(ServiceError):
    status, category = 400, "user"


class Unauthorized(ServiceError):
    """No valid credential; ``challenge`` is the response's ``WWW-Authenticate`` header."""

    status, category = 401, "user"
    challenge = "Bearer"


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


class ClientClosedRequest(ServiceError):
    """The client went away before its answer (HTTP 499, nginx's convention): nobody reads the
    response, and the server logs it at INFO, not as a failure."""

    status, category = 499, "user"


class InternalError(ServiceError):
    """An exception nobody expected: a bug or a broken dependency, never the caller's fault."""

    status, category = 500, "server"


class Unavailable(ServiceError):
    """A service the server depends on (the state store) is unreachable: HTTP 503, retryable.

    The request did not run, or ran no further than the failed store call; a client retries it
    after ``retry_after`` seconds."""

    status, category = 503, "server"


class AtCapacity(ServiceError):
    """No room for another adapter (``max_loras``): HTTP 503, Tinker ``paused_capacity``."""

    status, category = 503, "server"


class InsufficientStorage(ServiceError):
    """The server's disk is full (or over quota): HTTP 507; the failed write was not kept."""

    status, category = 507, "server"


class OutOfMemory(AtCapacity):
    """The device or host ran out of memory: retryable like :class:`AtCapacity` (HTTP 503)."""


def from_exception(
    exc: BaseException,
    *,
    request_id: str | None = None,
    names: Mapping[str, str] | None = None,
) -> ServiceError:
    """The service error for ``exc``: user mistakes are 4xx, the rest 5xx.

    An exception that is not a user mistake is logged here with its traceback and the request id
    that its 5xx body carries (``request_id``, else the current request's, else a new one); a
    client that went away is logged at INFO and answered 499 (nobody reads it).

    Args:
        exc: What was raised.
        request_id: The id a 5xx names.
        names: Internal adapter ids and the tenant's names for them: the message names the
            tenant's adapter, and any other internal id reads ``<another adapter>``.
    """
    error = _service_error(_unwrap_ray(exc), request_id)
    if names is None:
        return error
    message = name_adapters(error.message, names)
    return error if message == error.message else _with_message(error, message)


def name_adapters(message: str, names: Mapping[str, str]) -> str:
    """``message`` with each internal adapter id in ``names`` replaced by the tenant's name, and
    every other internal id by :data:`OTHER_ADAPTER`."""
    return INTERNAL_ADAPTER_ID.sub(lambda m: names.get(m.group(0), OTHER_ADAPTER), message)


def _with_message(error: ServiceError, message: str) -> ServiceError:
    """A copy of ``error`` saying ``message``: the original may be shared by the tenants of one
    fused pass, each of whom reads only its own names."""
    copy = type(error).__new__(type(error))
    copy.__dict__.update(error.__dict__)
    copy.args, copy.message = (message,), message
    copy.__cause__ = error.__cause__
    return copy


def _service_error(exc: BaseException, request_id: str | None) -> ServiceError:
    if isinstance(exc, ServiceError):
        return exc
    user = _user_error(exc)
    if user is not None:
        return user
    if isinstance(exc, AdapterCapacityError):
        # twinkle.model.paging: every resident adapter busy, or paging storage full.
        text = str(exc) if RETRY_LATER in str(exc) else f"{exc}; {RETRY_LATER}"
        return AtCapacity(text, retry_after=ADAPTER_CAPACITY_RETRY_S)
    rid = request_id or current_request_id() or new_request_id()
    if any(c.__name__ in _CLIENT_GONE for c in type(exc).__mro__):
        logger.info("request %s: the client went away (%s)", rid, type(exc).__name__)
        return ClientClosedRequest(
            f"the client went away before its answer (request id {rid})", request_id=rid
        )
    if is_out_of_memory(exc):
        error: ServiceError = OutOfMemory(
            f"the server ran out of memory; {RETRY_LATER} (request id {rid})",
            retry_after=OUT_OF_MEMORY_RETRY_S,
            request_id=rid,
        )
    elif isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        error = InsufficientStorage(
            f"the server's storage is full ({os.strerror(exc.errno)}): the write failed and "
            f"nothing of it was kept (earlier checkpoints are intact); retry once space is "
            f"freed (request id {rid})",
            request_id=rid,
        )
    else:
        error = InternalError(f"internal server error (request id {rid})", request_id=rid)
    logger.error("request %s failed with %s: %s", rid, type(exc).__name__, exc, exc_info=exc)
    return error


def _unwrap_ray(exc: BaseException) -> BaseException:
    """The exception a Ray actor or Serve replica raised, without Ray's wrapper.

    Ray re-raises a remote error as ``RayTaskError(<cause class>)``, whose ``str()`` is the
    remote traceback with the actor's pid, ip and id: never something a client should read.
    By class name, so that this module does not import Ray.
    """
    seen = 0
    while seen < 8 and any(c.__name__ == "RayTaskError" for c in type(exc).__mro__):
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException) or cause is exc:
            break
        exc, seen = cause, seen + 1
    return exc


def _user_error(exc: BaseException) -> ServiceError | None:
    if isinstance(exc, (UnknownAdapterError, PathNotFoundError)):
        return NotFound(str(exc).strip("'\""))
    if isinstance(exc, PathForbiddenError):
        return Forbidden(str(exc))
    if isinstance(exc, TwinkleError):
        return BadRequest(str(exc))
    if isinstance(exc, ValidationError):
        return BadRequest(f"invalid request: {exc}")
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """``MemoryError``, ``torch.OutOfMemoryError`` (CUDA) or a runtime error saying so.

    By class name, so that the server does not import torch to ask.
    """
    if isinstance(exc, MemoryError):
        return True
    if any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)
