"""``POST /{op}``: the JSON body handed to a service's ``call(owner, op, body)`` and answered as
``{"result": ...}``, for the deployments whose every operation is such a call (processor,
sampler). The app binds its service as ``operation_service`` (:func:`~.bind.bind_router`)."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Request

from twinkle.server.web.bind import bound
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


__all__ = ["OperationService", "router"]
