"""What every Tinker handler takes: this server's :class:`TinkerApi`, the caller, and its request
as the SDK's own type (read once, by :func:`~twinkle.server.tinker.request_fields.parse`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from twinkle.server.tinker.api import TinkerApi
from twinkle.server.tinker.request_fields import parse
from twinkle.server.web.bind import bound
from twinkle.server.web.errors import PayloadTooLarge
from twinkle.server.web.http import read_json

#: This server's Tinker API, bound to each request by ``create_tinker_router``
#: (:func:`~twinkle.server.web.bind.bind_router`: the handlers are module-level and shared by
#: every app built in one process).
Api = Annotated[TinkerApi, bound("tinker_api")]


def caller(request: Request, api: Api) -> str:
    """The tenant the request's API key (or token) names; 401 without one."""
    return api.ctx.authenticate(request.headers)


Owner = Annotated[str, Depends(caller)]


class SdkBody:
    """Dependency: the JSON body as the SDK's request type of ``endpoint``, read after the
    caller is authenticated (an anonymous request is a 401, whatever its body)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def __call__(self, request: Request, api: Api, _owner: Owner) -> Any:
        return parse(self.endpoint, await read_json(request, api.max_bytes))


def sdk_body(endpoint: str) -> Any:
    """``Depends`` on the body of ``endpoint`` (``body: Annotated[T, sdk_body("...")]``)."""
    return Depends(SdkBody(endpoint))


def idempotency_key(request: Request) -> str | None:
    return request.headers.get("x-idempotency-key")


IdemKey = Annotated[str | None, Depends(idempotency_key)]


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body (protobuf, or JSON decoded by the caller), refused past ``max_bytes``."""
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes")
    return bytes(body)
