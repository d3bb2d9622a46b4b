"""``POST /{op}``: the JSON body handed to a service's ``call(owner, op, body)`` and answered as
``{"result": ...}``, for the deployments whose every operation is such a call (processor,
sampler). An app includes :func:`operation_routes` over its service."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Request

from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.http import Authenticator, read_json


class OperationService(Protocol):
    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any: ...


router = APIRouter()


@router.post("/{op}")
async def call(
    op: str,
    request: Request,
    service: Annotated[OperationService, bound("operation_service")],
    authenticate: Annotated[Authenticator, bound("authenticate")],
    max_request_bytes: Annotated[int, bound("max_request_bytes")],
):
    owner = authenticate(request.headers)
    return {"result": await service.call(owner, op, await read_json(request, max_request_bytes))}


def operation_routes(
    service: OperationService, authenticate: Authenticator, max_request_bytes: int
) -> APIRouter:
    """:data:`router` bound to one app's ``service``, key check and body limit."""
    return bind_router(
        router,
        operation_service=service,
        authenticate=authenticate,
        max_request_bytes=max_request_bytes,
    )


__all__ = ["OperationService", "operation_routes", "router"]
