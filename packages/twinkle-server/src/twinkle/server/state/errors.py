"""Errors of the state layer, each carrying the HTTP status the gateway answers with.

A record owned by another tenant raises :class:`NotFoundError`, exactly like a missing one, so that a
tenant can never learn whether another tenant's id exists.
"""

from __future__ import annotations


class StateError(Exception):
    """Base class of every state error; ``status_code`` is the HTTP status to answer with."""

    status_code: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(StateError):
    """The request is malformed (bad checkpoint name or path, unknown field)."""

    status_code = 400


class ForbiddenError(StateError):
    """The operation would leave the tenant's storage or is otherwise not allowed."""

    status_code = 403


class NotFoundError(StateError):
    """The record does not exist, or belongs to another tenant (indistinguishable on purpose)."""

    status_code = 404


class ConflictError(StateError):
    """The record already exists or is in a state that forbids the operation."""

    status_code = 409


class GoneError(StateError):
    """The session is finished; the Tinker SDK stops its heartbeat loop on 410."""

    status_code = 410
