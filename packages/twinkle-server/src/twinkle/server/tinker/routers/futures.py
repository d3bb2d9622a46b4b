"""Tinker routes that retrieve futures: one result, or a sampling session's completions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response
from tinker import types

from twinkle.server.tinker import session_futures, wire_json
from twinkle.server.tinker.futures import PROTOBUF
from twinkle.server.tinker.routers._deps import Api, Owner, sdk_body

router = APIRouter()


@router.post("/retrieve_future")
async def retrieve_future(
    request: Request,
    api: Api,
    owner: Owner,
    body: Annotated[types.FutureRetrieveRequest, sdk_body("retrieve_future")],
):
    wants_protobuf = wire_json.wants_protobuf(request.headers)
    result = await session_futures.retrieve_future(api, owner, body, wants_protobuf)
    return Response(result, media_type=PROTOBUF) if isinstance(result, bytes) else result


@router.post("/retrieve_futures")
async def retrieve_futures(
    api: Api,
    owner: Owner,
    body: Annotated[types.FuturesRetrieveRequest, sdk_body("retrieve_futures")],
) -> dict:
    return await session_futures.retrieve_futures(api, owner, body)
