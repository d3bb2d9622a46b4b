"""Tinker client plumbing: the client config, its dynamic part, telemetry, ``cancel_future``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from twinkle.server.tinker.api import CLIENT_CONFIG
from twinkle.server.tinker.routers._deps import Api, Owner, read_body
from twinkle.server.web.http import read_json

router = APIRouter()


@router.post("/client/config")
async def client_config(owner: Owner) -> dict:
    return dict(CLIENT_CONFIG)


@router.post("/client/dynamic_config")
async def dynamic_config(owner: Owner) -> dict:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.post("/telemetry")
async def telemetry(request: Request, api: Api, owner: Owner) -> dict:
    """Accepted and dropped (read, so that an oversized body is still a 413)."""
    await read_body(request, api.max_bytes)
    return {"status": "accepted"}


@router.post("/cancel_future")
async def cancel_future(request: Request, api: Api, owner: Owner) -> dict:
    """Accepted and ignored (``sample_cancel_enabled`` is off); another key's future is
    unknown (404), as on every route taking an id. The SDK has no type for this body."""
    rid = (await read_json(request, api.max_bytes)).get("request_id")
    if isinstance(rid, str):
        api.state.get_future(owner, rid)
    return {}
