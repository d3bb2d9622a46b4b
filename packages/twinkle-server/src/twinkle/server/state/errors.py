"""Errors of the state layer: the service errors of :mod:`twinkle.server.web.errors`, by state name.

A record owned by another tenant raises :class:`NotFoundError`, exactly like a missing one, so that a
tenant can never learn whether another tenant's id exists.
"""

from __future__ import annotations

from twinkle.server.web.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ServiceError,
    Unavailable,
)


class StateError(ServiceError):
    """Base class of every state error; ``status_code`` is the HTTP status to answer with."""


class BadRequestError(StateError, BadRequest):
    """The request is malformed (bad checkpoint name or path, unknown field)."""


class ForbiddenError(StateError, Forbidden):
    """The operation would leave the tenant's storage or is otherwise not allowed."""


class NotFoundError(StateError, NotFound):
    """The record does not exist, or belongs to another tenant (indistinguishable on purpose)."""


class ConflictError(StateError, Conflict):
    """The record already exists or is in a state that forbids the operation."""


class GoneError(StateError, Gone):
    """The session is finished; the Tinker SDK stops its heartbeat loop on 410."""


class StoreUnavailableError(StateError, Unavailable):
    """The state store (Redis) cannot be reached: 503 with ``retry_after``, never blamed on the
    caller and never a generic 500, so clients retry and operators read which dependency failed."""
