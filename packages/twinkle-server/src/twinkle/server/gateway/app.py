"""The gateway (``server`` application, ``/api/v1``): one FastAPI app built from routers."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI

from twinkle.model.checkpoint import sweep_partial_saves
from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends, unload_session_adapters
from twinkle.server.gateway.routes_common import create_common_router
from twinkle.server.gateway.routes_live_adapter import create_live_adapter_router
from twinkle.server.openapi_bodies import document_bodies, gateway_bodies
from twinkle.server.threads import off_loop
from twinkle.server.web import install_error_handlers

logger = logging.getLogger("twinkle.server.gateway")
#: How often housekeeping walks the storage for what killed saves left (seconds).
PARTIAL_SWEEP_EVERY_S = 600.0


def create_gateway_app(ctx: ServerContext, backends: Backends) -> FastAPI:
    """The gateway's routes over ``ctx`` (state, auth) and ``backends`` (models, samplers)."""
    app = FastAPI(title="Twinkle server")
    install_error_handlers(app)
    document_bodies(app, gateway_bodies)
    app.include_router(create_common_router(ctx, backends))
    app.include_router(create_live_adapter_router(ctx, backends))
    try:
        from twinkle.server.tinker.routes import create_tinker_router
    except ImportError:
        pass
    else:
        app.include_router(create_tinker_router(ctx, backends))
    app.state.twinkle = ctx
    return app


async def expire_sessions(ctx: ServerContext, backends: Backends) -> list[str]:
    """Finish sessions that stopped heartbeating and unload the adapters they created."""
    # A client cannot heartbeat a server that is down: after a restart every session gets a
    # full timeout from this process's start before it can expire.
    timeout = ctx.server_args.heartbeat_timeout_s
    up_long_enough = ctx.state.clock() - ctx.started_at > timeout
    expired = ctx.state.expired_sessions(timeout) if up_long_enough else []
    for session in expired:
        ctx.state.finish_session(session.owner, session.session_id)
        names = await unload_session_adapters(backends, session.session_id)
        if names:
            logger.info("session %s expired: unloaded %s", session.session_id, ", ".join(names))
    return [s.session_id for s in expired]


async def housekeep_once(ctx: ServerContext, backends: Backends) -> None:
    """One round: expire silent sessions, delete expired checkpoints (TTL passed, or the
    ephemeral sampler snapshots of a finished session) with their files, purge old futures;
    every ``PARTIAL_SWEEP_EVERY_S``, clear what killed saves left in the storage."""
    import shutil

    await expire_sessions(ctx, backends)
    for ckpt in ctx.state.expired_checkpoints():
        ctx.state.delete_checkpoint(ckpt.owner, ckpt.training_run_id, ckpt.checkpoint_id)
        shutil.rmtree(ckpt.local_dir, ignore_errors=True)
    ctx.state.purge_futures(older_than=ctx.server_args.future_ttl_s)
    now = time.monotonic()
    if now - ctx.partial_sweep_at >= PARTIAL_SWEEP_EVERY_S:  # a walk of the whole storage
        ctx.partial_sweep_at = now
        for path in await off_loop(sweep_partial_saves, ctx.storage_root):
            logger.info("storage: cleared what a killed save left: %s", path)


async def housekeeping_forever(
    ctx: ServerContext, backends: Backends, interval_s: float = 10.0
) -> None:
    """:func:`housekeep_once` every ``interval_s`` seconds."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await housekeep_once(ctx, backends)
        except Exception:  # keep housekeeping alive; the next round retries
            logger.exception("housekeeping failed")
