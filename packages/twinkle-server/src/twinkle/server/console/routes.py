"""The console's routes on the gateway: the page and its assets (no key: they hold no data), and
``/console/api/*`` (the caller's key, as on every other route; the admin view for admin keys only).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from twinkle.server.console.access import admin_tenants as admin_tenants_of
from twinkle.server.console.access import admin_tenants_from_env
from twinkle.server.console.overview import operator_view, pending_calls, sessions_of
from twinkle.server.gateway.backends import Backends
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import Forbidden, NotFound

CONSOLE_PATH = "/console"
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def static_files() -> dict[str, bytes]:
    """The console's assets by file name, read from this package (they ship in the wheel)."""
    folder = resources.files("twinkle.server.console").joinpath("static")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and any(entry.name.endswith(s) for s in _MEDIA_TYPES)
    }


def _asset(files: dict[str, bytes], name: str) -> Response:
    if name not in files:
        raise NotFound(f"the console has no file {name!r}")
    media = next(t for s, t in _MEDIA_TYPES.items() if name.endswith(s))
    # Assets change with the installed version only; the page is re-validated on every load.
    return Response(files[name], media_type=media, headers={"Cache-Control": "no-cache"})


router = APIRouter(prefix=CONSOLE_PATH, tags=["console"])
Ctx = Annotated[Any, bound("twinkle_ctx")]
Models = Annotated[Backends, bound("gateway_backends")]
Admins = Annotated[frozenset, bound("console_admins")]
Files = Annotated[dict, bound("console_files")]


@router.get("", include_in_schema=False)
async def console_root() -> RedirectResponse:
    return RedirectResponse("console/", status_code=307)


@router.get("/", include_in_schema=False)
async def page(files: Files) -> Response:
    return _asset(files, "index.html")


@router.get("/static/{name}", include_in_schema=False)
async def asset(name: str, files: Files) -> Response:
    return _asset(files, name)


@router.get("/api/me")
async def me(request: Request, ctx: Ctx, admins: Admins) -> dict:
    """Who the key is, and whether it sees the admin view."""
    tenant = ctx.authenticate(request.headers)
    return {"tenant_id": tenant, "admin": tenant in admins}


@router.get("/api/sessions")
async def sessions(request: Request, ctx: Ctx) -> dict:
    """The caller's sessions, newest first, with the runs each created."""
    return {"sessions": sessions_of(ctx.state, ctx.authenticate(request.headers))}


@router.get("/api/queue")
async def queue(request: Request, ctx: Ctx) -> dict:
    """The caller's pending calls and their place in each model's line."""
    return {"pending": pending_calls(ctx.state, ctx.authenticate(request.headers))}


@router.get("/api/admin")
async def admin(request: Request, ctx: Ctx, backends: Models, admins: Admins) -> dict:
    """Every tenant, the loaded adapters, pending calls per tenant and the adapter slots of
    every model: admin keys only (403 for any other key)."""
    tenant = ctx.authenticate(request.headers)
    if tenant not in admins:
        raise Forbidden(
            "the operator view needs an admin key (the server config's "
            "auth.admin_api_key_sha256, or TWINKLE_CONSOLE_ADMIN_KEYS in the gateway's "
            "environment); this key sees its own runs only"
        )
    capacity = {
        name: await client.call(tenant, "capacity_info", {})
        for name, client in backends.models.items()
    }
    return {**operator_view(ctx.state), "capacity": capacity}


def create_console_router(
    ctx: Any, backends: Backends, admin_tenants: Iterable[str] | None = None
) -> APIRouter:
    """The console under :data:`CONSOLE_PATH`: :data:`router` over ``ctx`` and ``backends``.

    Args:
        ctx: The gateway's :class:`~twinkle.server.context.ServerContext` (state, auth).
        backends: The model deployments (their adapter slots, for the admin view).
        admin_tenants: Tenant ids of admin keys (default: the config's
            ``auth.admin_api_key_sha256`` and ``TWINKLE_CONSOLE_ADMIN_KEYS``).
    """
    if admin_tenants is None:
        # The config's digests and the environment's keys together (the environment is the
        # gateway process's own, so a Ray launch needs the config field).
        admin_tenants = admin_tenants_from_env() | admin_tenants_of(
            ctx.config.auth.admin_api_key_sha256
        )
    return bind_router(
        router,
        twinkle_ctx=ctx,
        gateway_backends=backends,
        console_admins=frozenset(admin_tenants),
        console_files=static_files(),
    )


__all__ = ["CONSOLE_PATH", "create_console_router", "static_files"]
