"""Tinker ``RestClient`` routes: sessions, their search, project and trace export, and every
checkpoint of the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from tinker import types

from twinkle.server.tinker import sessions, traces
from twinkle.server.tinker.routers._deps import Api, Owner, sdk_body
from twinkle.server.web.http import read_json

router = APIRouter()


@router.get("/sessions")
async def list_sessions(
    api: Api, owner: Owner, limit: int = Query(20, ge=0, le=1000), offset: int = Query(0, ge=0)
) -> dict:
    return sessions.list_sessions(api, owner, limit, offset)


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, api: Api, owner: Owner) -> dict:
    return sessions.get_session(api, owner, session_id)


@router.put("/sessions/{session_id}/project")
async def assign_project(session_id: str, request: Request, api: Api, owner: Owner) -> dict:
    project_id = (await read_json(request, api.max_bytes)).get("project_id")
    return sessions.assign_project(api, owner, session_id, project_id)


@router.get("/sessions/{session_id}/trace_export")
async def trace_export(session_id: str, request: Request, api: Api, owner: Owner) -> dict:
    api.state.get_session(owner, session_id)
    return {"status": "ready", "url": traces.signed_url(api.ctx.signer, request, owner, session_id)}


@router.get("/trace_exports/{token}")
async def trace_download(token: str, api: Api) -> dict:
    """No API key: the signed token is the credential (its name is the route's, for url_for)."""
    owner, session_id = traces.verify(api.ctx.signer, token)
    return traces.build(api.state, owner, session_id)


@router.post("/sessions/search")
async def search_sessions(
    api: Api, owner: Owner, body: Annotated[types.SessionSearchRequest, sdk_body("sessions/search")]
) -> dict:
    return sessions.search(api, owner, body)


@router.get("/checkpoints")
async def list_user_checkpoints(
    api: Api, owner: Owner, limit: int = Query(100, ge=0, le=1000), offset: int = Query(0, ge=0)
) -> dict:
    return sessions.list_user_checkpoints(api, owner, limit, offset)
