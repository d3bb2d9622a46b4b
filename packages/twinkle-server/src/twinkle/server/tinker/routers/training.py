"""Tinker training routes: models, forward(_backward), optim_step, custom losses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from tinker import types

from twinkle.server.tinker import custom_loss, training, wire, wire_json
from twinkle.server.tinker.routers._deps import Api, IdemKey, Owner, read_body, sdk_body

router = APIRouter()


@router.post("/create_model")
async def create_model(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.CreateModelRequest, sdk_body("create_model")],
) -> dict:
    return await training.create_model(api, owner, body, idem)


@router.post("/get_info")
async def get_info(
    api: Api, owner: Owner, body: Annotated[types.GetInfoRequest, sdk_body("get_info")]
) -> dict:
    return await training.get_info(api, owner, body)


@router.post("/forward_backward")
async def forward_backward(request: Request, api: Api, owner: Owner, idem: IdemKey) -> dict:
    """``ForwardBackwardRequest`` as protobuf (maybe zstd), or as JSON from SDKs before 0.27."""
    raw = await read_body(request, api.max_bytes)
    if "json" in request.headers.get("content-type", ""):
        body = raw
        msg = wire_json.decode_forward_backward(wire_json.loads(raw), forward_only=False)
    else:
        body = wire.decompress(raw, request.headers.get("content-encoding"), api.max_bytes)
        msg = wire.decode_forward_backward(body)
    return await training.forward_backward(api, owner, msg, raw, body, idem)


@router.post("/forward")
async def forward(request: Request, api: Api, owner: Owner, idem: IdemKey) -> dict:
    """``ForwardRequest`` as JSON: how SDKs before 0.27 ask for a forward pass."""
    raw = await read_body(request, api.max_bytes)
    msg = wire_json.decode_forward_backward(wire_json.loads(raw), forward_only=True)
    return await training.forward_backward(api, owner, msg, raw, raw, idem)


@router.post("/optim_step")
async def optim_step(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.OptimStepRequest, sdk_body("optim_step")],
) -> dict:
    return await training.optim_step(api, owner, body, idem)


@router.post("/unload_model")
async def unload_model(
    api: Api, owner: Owner, body: Annotated[types.UnloadModelRequest, sdk_body("unload_model")]
) -> dict:
    return await training.unload_model(api, owner, body)


@router.post("/create_custom_loss")
async def create_custom_loss(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.CreateCustomLossRequest, sdk_body("create_custom_loss")],
) -> dict:
    """Check and store a ``CustomLossGraph`` for ``forward_backward(loss_fn="custom")``."""
    return custom_loss.create(api, owner, body, idem)
