"""Web plumbing shared by every deployment's FastAPI app: errors, body limits, authentication."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from twinkle.server.web import request_ids
from twinkle.server.web.errors import (
    BadRequest,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    from_exception,
)

Authenticator = Callable[[Any], str]
"""Takes the request headers, returns the tenant id, raises ``Unauthorized``."""

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


def install_error_handlers(app: FastAPI) -> None:
    """Every error becomes a JSON body with its status, ``Retry-After`` and the request id.

    A :class:`ServiceError` (state and auth errors included) keeps its status; any other exception
    goes through :func:`from_exception` (:class:`RequestIds`). Also installs the HTTP telemetry (a
    span and request metrics per request; no-op when off), outside the request ids so that it
    records the status the client got.
    """
    from twinkle.server.telemetry import install_http_telemetry

    app.add_middleware(RequestIds)
    install_http_telemetry(app)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(BadRequest(f"invalid request: {exc.errors()}"))

    app.add_exception_handler(StarletteHTTPException, http_error)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The router's own errors (no route matches, method not allowed) in the JSON error format
    of every other answer, not Starlette's plain ``Not Found``."""
    if exc.status_code == 404:
        error: ServiceError = NotFound(
            f"no route matches {request.method} {request.url.path}: check the path's ids, "
            "names and tokens (none may contain '/')"
        )
    else:
        error = ServiceError(str(exc.detail))
        error.status = error.status_code = exc.status_code
        error.category = "user" if 400 <= exc.status_code < 500 else "server"
    response = error_response(error)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


def error_response(exc: ServiceError) -> JSONResponse:
    """The JSON response for ``exc``, with the current request's id when it has none of its own."""
    body = exc.to_dict()
    body.setdefault("request_id", request_ids.current_request_id())
    headers = {}
    if exc.retry_after:
        # Rounded up: a client that retries when the header says must not be refused again.
        # Retry-After-Ms is the exact wait (the Tinker SDK reads it before Retry-After).
        headers["Retry-After"] = f"{max(1, math.ceil(exc.retry_after))}"
        headers["Retry-After-Ms"] = f"{math.ceil(exc.retry_after * 1000)}"
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = exc.challenge
    return JSONResponse(body, status_code=exc.status, headers=headers or None)


class RequestIds:
    """ASGI middleware: an id per request, and a JSON error for an exception no handler took.

    The id is the request's ``X-Request-ID`` (the Serve proxy always sends one, and adds it to the
    response itself) or a new one, which is then returned in the ``X-Request-ID`` header. An
    unexpected exception is logged with its traceback and that id (:func:`from_exception`) and
    answered with a 5xx that names the id and nothing else about the failure.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = request_ids.REQUEST_ID_HEADER.encode()
        sent = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == header), None)
        given = request_ids.accepted_request_id(sent)
        rid = given or request_ids.new_request_id()
        token = request_ids.set_current(rid)
        started = False

        async def send_with_id(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if given is None:
                    message = {
                        **message,
                        "headers": [*message.get("headers", ()), (header, rid.encode())],
                    }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if started:  # too late for an error body; the server's own handling logs it
                raise
            await error_response(from_exception(exc, request_id=rid))(scope, receive, send_with_id)
        finally:
            request_ids.reset_current(token)


async def read_json(request: Request, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> dict[str, Any]:
    """The request's JSON object body, refusing oversized or malformed bodies with a clear 4xx."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(
            f"request body of {declared} bytes is over the limit of {max_bytes} bytes"
        )
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes")
    if not body:
        return {}
    return parse_json_object(bytes(body))


def parse_json_object(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object, or a :class:`BadRequest` that names the offending field.

    Stricter than ``json.loads``: ``NaN``/``Infinity`` literals and numbers too large for a float
    (``1e999`` parses as ``inf``) are refused, since no field takes a non-finite number and one
    that slips through poisons a sampler or an optimizer; nesting deeper than
    :data:`MAX_JSON_DEPTH` is refused too (the stdlib parser recurses and would overflow the stack).
    """
    try:
        value = json.loads(body)
    except RecursionError:
        raise BadRequest(f"JSON body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the JSON body must be an object, got {type(value).__name__}")
    _check_json_values(value)
    return value


MAX_JSON_DEPTH = 64


def _check_json_values(value: Any) -> None:
    """Refuse non-finite numbers and deep nesting, naming where (iterative: no recursion)."""
    # (container, its path) pairs; a path is only rendered to text for the error message.
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            raise BadRequest(f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        values = item.values() if isinstance(item, dict) else item
        kinds = set(map(type, values))  # C speed: most lists are all ints or all floats
        if kinds <= _PLAIN or (kinds <= _NUMBERS and _all_finite(values)):
            continue
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(child, float):
                if not math.isfinite(child):
                    raise BadRequest(
                        f"{_json_path((*path, key))}: {child!r} is not a finite number"
                    )
            elif isinstance(child, (dict, list)):
                stack.append((child, (*path, key)))


_PLAIN = {int, str, bool, type(None)}
_NUMBERS = {int, float, bool}


def _all_finite(values: Any) -> bool:
    try:
        return all(map(math.isfinite, values))
    except OverflowError:  # an int too large for a float: look at each value
        return False


def _json_path(path: tuple) -> str:
    return "body" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)


def authenticator_from(auth: Any) -> Authenticator:
    """Adapt an auth object (``authenticate(headers) -> principal``) to an :data:`Authenticator`."""

    def authenticate(headers: Any) -> str:
        try:
            principal = auth.authenticate(headers)
        except ServiceError:
            raise
        except Exception as exc:  # the auth module's own error type
            raise Unauthorized(str(getattr(exc, "message", None) or exc)) from None
        return principal.tenant_id

    return authenticate


class StartOnFirstRequest:
    """ASGI middleware that starts a background coroutine on the replica's event loop with the
    first HTTP request (a Serve replica's loop is not running yet when its app is built).

    Pure ASGI on purpose: Starlette's ``@app.middleware("http")`` wraps every request in extra
    tasks and streams, which costs more per request than a whole small model request does
    without it.

    Args:
        app: The wrapped ASGI app.
        start: Returns the coroutine to run forever (``sweep_forever(...)``).
    """

    def __init__(self, app: Any, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.app, self._start = app, start
        self.task: asyncio.Task | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.task is None and scope["type"] == "http":
            self.task = asyncio.get_running_loop().create_task(self._start())
        await self.app(scope, receive, send)
