"""Tinker weights routes: save, save for sampler, load, info, publish to the hub."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from tinker import types

from twinkle.server.tinker import weights
from twinkle.server.tinker.request_fields import LoadWeightsRequest
from twinkle.server.tinker.routers._deps import Api, IdemKey, Owner, sdk_body
from twinkle.server.web.auth import caller_key
from twinkle.server.web.http import read_json

router = APIRouter()
CHECKPOINT = "/training_runs/{run_id}/checkpoints/{kind}/{name}"


@router.post("/save_weights")
async def save_weights(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.SaveWeightsRequest, sdk_body("save_weights")],
) -> dict:
    return await weights.save_weights(api, owner, body, idem)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.SaveWeightsForSamplerRequest, sdk_body("save_weights_for_sampler")],
) -> dict:
    return await weights.save_weights_for_sampler(api, owner, body, idem)


@router.post("/load_weights")
async def load_weights(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[LoadWeightsRequest, sdk_body("load_weights")],
) -> dict:
    return await weights.load_weights(api, owner, body, idem)


@router.post("/weights_info")
async def weights_info(request: Request, api: Api, owner: Owner) -> dict:
    """``{tinker_path}`` (the SDK sends it without a request type of its own)."""
    body = await read_json(request, api.max_bytes)
    return weights.weights_info(api, owner, body.get("tinker_path") or "")


@router.post(f"{CHECKPOINT}/publish")
async def publish(run_id: str, kind: str, name: str, request: Request, api: Api, owner: Owner):
    key = caller_key(request.headers, api.ctx.signer)
    return await weights.publish(api, owner, key, run_id, kind, name)


@router.delete(f"{CHECKPOINT}/publish")
async def unpublish(run_id: str, kind: str, name: str, api: Api, owner: Owner) -> dict:
    return weights.unpublish(api, owner, run_id, kind, name)
