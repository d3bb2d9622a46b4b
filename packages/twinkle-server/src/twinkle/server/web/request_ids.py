"""The id of the request being served, for error bodies and the log line with the traceback.

The web middleware (:class:`twinkle.server.web.RequestIds`) sets it per HTTP request. Behind the
Ray Serve proxy the id is Serve's own (``x-request-id``), which Serve also hands to every
deployment the request calls, so the gateway and the model replica log the same id.
"""

from __future__ import annotations

import re
import sys
import uuid
from contextvars import ContextVar

REQUEST_ID_HEADER = "x-request-id"
_CURRENT: ContextVar[str | None] = ContextVar("twinkle_request_id", default=None)
# An id taken from a client's header lands in logs and bodies: keep it short and plain.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_request_id() -> str:
    """A fresh id (uuid4 hex)."""
    return uuid.uuid4().hex


def accepted_request_id(value: str | None) -> str | None:
    """``value`` when it is usable as a request id (short, plain characters), else ``None``."""
    return value if value and _SAFE_ID.fullmatch(value) else None


def set_current(request_id: str):
    """Make ``request_id`` current; returns the token for :func:`reset_current`."""
    return _CURRENT.set(request_id)


def reset_current(token) -> None:
    _CURRENT.reset(token)


def current_request_id() -> str | None:
    """The id of the request this code serves: ours, else Ray Serve's, else ``None``."""
    found = _CURRENT.get()
    if found:
        return found
    # Only when Serve is already loaded: this module must not import ray.
    serve_context = sys.modules.get("ray.serve.context")
    if serve_context is not None:
        try:
            found = serve_context._get_serve_request_context().request_id
        except Exception:  # noqa: BLE001 - a private Ray API; no id is better than a crash
            found = None
    return accepted_request_id(found)
