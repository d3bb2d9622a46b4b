"""The gateway (``server`` application, ``/api/v1``): one FastAPI app built from routers."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI

from twinkle.model.checkpoint import sweep_partial_saves
from twinkle.server.console import create_console_router
from twinkle.server.context import ServerContext
from twinkle.server.export import create_export_router
from twinkle.server.gateway.backends import Backends, unload_session_adapters
from twinkle.server.gateway.openai_api import create_openai_router
from twinkle.server.gateway.routes_common import create_common_router, delete_in_order
from twinkle.server.gateway.routes_live_adapter import create_live_adapter_router
from twinkle.server.process.threads import off_loop
from twinkle.server.tinker.routers import create_tinker_router
from twinkle.server.web.http import install_error_handlers
from twinkle.server.web.openapi_bodies import document_bodies, gateway_bodies

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
    app.include_router(create_export_router(ctx))
    app.include_router(create_openai_router(ctx, backends))
    app.include_router(create_tinker_router(ctx, backends))
    app.include_router(create_console_router(ctx, backends))
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
    await expire_sessions(ctx, backends)
    await sweep_checkpoints(ctx, backends)
    ctx.state.purge_futures(older_than=ctx.server_args.future_ttl_s)
    ctx.state.compact_sessions()  # finished sessions past the kept count or their TTL
    now = time.monotonic()
    if now - ctx.partial_sweep_at >= PARTIAL_SWEEP_EVERY_S:  # a walk of the whole storage
        ctx.partial_sweep_at = now
        for path in await off_loop(sweep_partial_saves, ctx.storage_root):
            logger.info("storage: cleared what a killed save left: %s", path)


async def sweep_checkpoints(ctx: ServerContext, backends: Backends) -> None:
    """Delete the expired checkpoints and a finished session's snapshots, records and files,
    each in order with the saves of its run (:func:`delete_in_order`): a checkpoint saved
    again under its name since it expired is kept. They run side by side, so that one busy
    adapter's queue does not hold up the others."""
    doomed = ctx.state.expired_checkpoints()
    results = await asyncio.gather(
        *(
            delete_in_order(
                ctx.state,
                backends,
                c.owner,
                c.training_run_id,
                c.kind,
                c.name,
                only_expired=not c.ephemeral,  # a snapshot's unique name is never saved again
            )
            for c in doomed
        ),
        return_exceptions=True,
    )
    for ckpt, result in zip(doomed, results):
        if isinstance(result, Exception):
            logger.warning("sweeping checkpoint %s failed: %s", ckpt.path, result)


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
