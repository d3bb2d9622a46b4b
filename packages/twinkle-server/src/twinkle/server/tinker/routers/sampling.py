"""Tinker sampling routes: sampling sessions and ``asample``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from tinker import types

from twinkle.server.tinker import sampling
from twinkle.server.tinker.routers._deps import Api, IdemKey, Owner, sdk_body

router = APIRouter()


@router.post("/create_sampling_session")
async def create_sampling_session(
    api: Api,
    owner: Owner,
    body: Annotated[types.CreateSamplingSessionRequest, sdk_body("create_sampling_session")],
) -> dict:
    return sampling.create_sampling_session(api, owner, body)


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, api: Api, owner: Owner) -> dict:
    return sampling.get_sampler(api, owner, sampler_id)


@router.post("/asample")
async def asample(
    api: Api, owner: Owner, idem: IdemKey, body: Annotated[types.SampleRequest, sdk_body("asample")]
) -> dict:
    return await sampling.asample(api, owner, body, idem)
