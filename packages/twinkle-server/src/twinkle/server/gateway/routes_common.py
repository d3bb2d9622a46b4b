"""Routes every client uses: health, capabilities, route table, sessions, runs and checkpoints.

Shapes follow the Tinker API (see TINKER_PROTOCOL.md); the Twinkle client reads the same ones.
Every route but the health check needs an API key and only ever sees its own records.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends, unload_session_adapters
from twinkle.server.gateway.route_table import route_table
from twinkle.server.model.registry import delete_checkpoint as forget_checkpoint
from twinkle.server.state._history import history_reply
from twinkle.server.state.paths import validate_ttl
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import BadRequest, Gone, NotFound
from twinkle.server.web.http import read_json


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def run_to_wire(run, state: Any) -> dict:
    """A run as the Tinker ``TrainingRun`` wire object; its last checkpoints are unexpired
    ones (:func:`_unexpired_last`)."""
    return {
        "training_run_id": run.training_run_id,
        "base_model": run.base_model,
        "model_owner": run.owner,
        "is_lora": run.is_lora,
        "corrupted": run.corrupted,
        "lora_rank": run.lora_rank,
        "last_request_time": _iso(run.last_request_time),
        "last_checkpoint": _unexpired_last(state, run, "weights"),
        "last_sampler_checkpoint": _unexpired_last(state, run, "sampler_weights"),
        "user_metadata": run.user_metadata or None,
        "status": run.status,
    }


def _unexpired_last(state: Any, run, kind: str) -> dict | None:
    """The run's newest checkpoint of ``kind`` that has not expired: the record's own pointer,
    unless that one has expired since it was set (then looked up again, as every other route
    sees an expired checkpoint: gone)."""
    last = run.last_checkpoint if kind == "weights" else run.last_sampler_checkpoint
    expires = (last or {}).get("expires_at")
    if not expires or datetime.fromisoformat(expires).timestamp() > state.clock():
        return last
    same = [c for c in state.list_checkpoints(run.owner, run.training_run_id) if c.kind == kind]
    newest = max(same, key=lambda c: (c.time, c.name), default=None)
    return None if newest is None else newest.to_tinker()


def checkpoint_to_wire(ckpt) -> dict:
    wire = ckpt.to_tinker()
    wire["twinkle_path"] = ckpt.path
    wire["training_run_id"] = ckpt.training_run_id
    return wire


router = APIRouter()
Ctx = Annotated[ServerContext, bound("twinkle_ctx")]
Models = Annotated[Backends, bound("gateway_backends")]
RouteTable = Annotated[dict, bound("route_table")]


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
async def capabilities(request: Request, ctx: Ctx, backends: Models) -> dict:
    ctx.authenticate(request.headers)
    names = list(
        dict.fromkeys(
            [
                *ctx.server_args.server_config.supported_models,
                *backends.models,
                *backends.samplers,
            ]
        )
    )
    return {
        "supported_models": [
            {
                "model_name": name,
                "max_context_length": backends.max_context.get(name),
                "trainable": name in backends.models,
                "sampleable": name in backends.samplers,
            }
            for name in names
        ]
    }


@router.get("/routes")
async def route_prefixes(request: Request, ctx: Ctx, routes: RouteTable) -> dict:
    ctx.authenticate(request.headers)
    return routes


@router.post("/create_session")
async def create_session(request: Request, ctx: Ctx) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    tags, metadata = body.get("tags") or [], body.get("user_metadata") or {}
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise BadRequest("tags must be a list of strings")
    if not isinstance(metadata, dict):
        raise BadRequest("user_metadata must be an object")
    for key in ("sdk_version", "project_id", "display_name"):
        if not isinstance(body.get(key), (str, type(None))):
            raise BadRequest(f"{key} must be a string or null")
    record = ctx.state.create_session(
        owner,
        tags=list(tags),
        user_metadata=metadata,
        sdk_version=body.get("sdk_version"),
        project_id=body.get("project_id"),
        display_name=body.get("display_name"),
    )
    return {"session_id": record.session_id, "type": "create_session"}


@router.post("/session_heartbeat")
async def heartbeat(request: Request, ctx: Ctx) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    ctx.state.heartbeat(owner, _required(body, "session_id", str))
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request, ctx: Ctx, backends: Models) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    reason = body.get("reason") if isinstance(body.get("reason"), dict) else {}
    ctx.state.finish_session(owner, session_id, reason.get("type"), body.get("detail"))
    # A finished session's adapters stop counting against the key's per_token_model_limit
    # now, not after adapter_timeout.
    await unload_session_adapters(backends, session_id)
    return {"session_id": session_id, "finished": True}


@router.get("/capacity_info")
async def capacity_info(request: Request, ctx: Ctx, backends: Models) -> dict:
    """Adapter slots of every trainable base model, and their sums."""
    owner = ctx.authenticate(request.headers)
    models = {
        name: await client.call(owner, "capacity_info", {})
        for name, client in backends.models.items()
    }
    totals = {
        key: sum(m[key] for m in models.values())
        for key in ("max_loras", "used_loras", "free_loras")
    }
    return {**totals, "models": models}


@router.get("/training_runs")
async def list_runs(
    request: Request,
    ctx: Ctx,
    limit: int = Query(20, ge=0, le=1000),
    offset: int = Query(0, ge=0),
    all_users: bool = Query(False),
) -> dict:
    # No key lists another key's runs (operator keys see tenants' counts in the console
    # only): ``all_users`` (ModelScope Twinkle's flag) answers the caller's own runs, as
    # without it; ``scope`` says so.
    owner = ctx.authenticate(request.headers)
    state = ctx.state
    runs, total = state.list_runs(owner, limit=limit, offset=offset)
    return {
        "training_runs": [run_to_wire(r, state) for r in runs],
        "cursor": {"offset": offset, "limit": limit, "total_count": total},
        "scope": "own",
    }


@router.get("/checkpoint_info")
async def checkpoint_info(request: Request, ctx: Ctx, twinkle_path: str = Query(...)) -> dict:
    """What a ``twinkle://`` path holds: the caller's own checkpoint or a published one."""
    owner = ctx.authenticate(request.headers)
    path = twinkle_path
    record = ctx.state.resolve_checkpoint_path(owner, path, allow_public=True)
    run = ctx.state.get_run(record.owner, record.training_run_id)
    return {
        "training_run_id": run.training_run_id,
        "base_model": run.base_model,
        "model_owner": run.owner,
        "is_lora": run.is_lora,
        "lora_rank": run.lora_rank,
        "lora_config": run.lora_config or None,
        "checkpoint_id": record.checkpoint_id,
        "checkpoint_type": record.kind,
        "twinkle_path": record.path,
    }


@router.get("/training_runs/{run_id}")
async def get_run(run_id: str, request: Request, ctx: Ctx) -> dict:
    return run_to_wire(ctx.state.get_run(ctx.authenticate(request.headers), run_id), ctx.state)


@router.get("/training_runs/{run_id}/checkpoints")
async def list_checkpoints(run_id: str, request: Request, ctx: Ctx) -> dict:
    owner = ctx.authenticate(request.headers)
    ctx.state.get_run(owner, run_id)
    return {
        "checkpoints": [
            checkpoint_to_wire(c)
            for c in ctx.state.list_checkpoints(owner, run_id)
            if not c.ephemeral
        ]
    }


@router.get("/training_runs/{run_id}/history")
async def training_history(
    run_id: str, request: Request, ctx: Ctx, since_step: int | None = Query(None, ge=0)
) -> dict:
    """The run's per-step figures (``TrainingHistory``), after ``since_step`` if given."""
    return history_reply(ctx.state, ctx.authenticate(request.headers), run_id, since_step)


@router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}")
async def delete_checkpoint(
    run_id: str, kind: str, name: str, request: Request, ctx: Ctx, backends: Models
) -> dict:
    owner = ctx.authenticate(request.headers)
    ctx.state.get_checkpoint(owner, run_id, f"{kind}/{name}")  # 404 when gone or expired
    return {"deleted": await delete_in_order(ctx.state, backends, owner, run_id, kind, name)}


@router.put("/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
async def set_ttl(run_id: str, kind: str, name: str, request: Request, ctx: Ctx) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    ttl = validate_ttl(body.get("ttl_seconds"))
    return checkpoint_to_wire(ctx.state.set_checkpoint_ttl(owner, run_id, f"{kind}/{name}", ttl))


def create_common_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """:data:`router` over ``ctx`` (state, auth, limits) and ``backends``."""
    return bind_router(
        router, twinkle_ctx=ctx, gateway_backends=backends, route_table=route_table(ctx.config)
    )


async def delete_in_order(
    state: Any,
    backends: Backends,
    owner: str,
    run_id: str,
    kind: str,
    name: str,
    only_expired: bool = False,
) -> str | None:
    """Delete ``owner``'s checkpoint ``kind/name`` of ``run_id`` in order with its saves.

    Only the adapter of an active run saves into it, always in that adapter's queue on its
    model replica; so the delete runs in the same queue (the model's ``delete_checkpoint``),
    after the saves queued before it. When no adapter holds the run (unloaded, lost, or a
    copy), nothing can save into it any more and the delete runs here. Returns the deleted
    path (``None``: ``only_expired`` and not expired, see
    :func:`twinkle.server.model.registry.delete_checkpoint`).
    """
    run = state.get_run(owner, run_id)
    client = backends.models.get(run.base_model)
    if run.status == "active" and run.adapter_name and client is not None:
        payload = {
            "adapter_name": run.adapter_name,
            "run_id": run_id,
            "kind": kind,
            "name": name,
            "only_expired": only_expired,
        }
        try:
            return (await client.call(owner, "delete_checkpoint", payload))["deleted"]
        except (NotFound, Gone):
            pass  # its adapter is gone (or so is the checkpoint: said again below)
    return forget_checkpoint(state, owner, run_id, kind, name, only_expired)


def _required(body: dict, key: str, kind: type | None = None):
    if key not in body:
        raise BadRequest(f"missing field {key!r}")
    if kind is not None and not isinstance(body[key], kind):
        wanted = {"str": "string", "int": "integer"}.get(kind.__name__, kind.__name__)
        raise BadRequest(f"{key} must be a {wanted}, got {type(body[key]).__name__}")
    return body[key]
