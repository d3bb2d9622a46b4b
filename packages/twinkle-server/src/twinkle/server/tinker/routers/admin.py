"""Tinker ``AdminClient`` routes, each scoped to the caller's own key, and ``auth/token``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from twinkle.server.tinker import admin
from twinkle.server.tinker.routers._deps import Api, Owner
from twinkle.server.web.auth import presented_key

router = APIRouter()


@router.get("/audit")
async def audit_log(
    api: Api, owner: Owner, event_type: str = "all", day: str | None = None
) -> dict:
    return admin.audit_log(api, owner, event_type, day)


@router.get("/billing/usage/events")
async def billing_usage(api: Api, owner: Owner, starting_on: str, ending_before: str) -> dict:
    return admin.billing_usage(api, owner, starting_on, ending_before)


@router.get("/billing/usage/checkpoints/current")
async def checkpoint_storage(api: Api, owner: Owner, project_id: str | None = None) -> dict:
    return admin.checkpoint_storage(api, owner, project_id)


@router.post("/auth/token")
async def auth_token(request: Request, api: Api, owner: Owner) -> dict:
    return admin.auth_token(api, owner, presented_key(request.headers) or "")


@router.get("/auth/apikey/me")
async def describe_own_key(owner: Owner) -> dict:
    return admin.describe_key(owner)


@router.delete("/auth/apikey/me")
async def delete_own_key(owner: Owner) -> dict:
    admin.delete_key()
    return {}
