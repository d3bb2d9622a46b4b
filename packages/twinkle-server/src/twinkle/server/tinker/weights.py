"""Tinker routes for weights: save, save for sampler, load (create from checkpoint), info, publish."""

from __future__ import annotations

import asyncio
import re
import uuid

from fastapi import APIRouter, Request

from twinkle.server.auth import caller_key
from twinkle.server.errors import BadRequest
from twinkle.server.hub import HubPublisher
from twinkle.server.state.paths import validate_checkpoint_name, validate_ttl
from twinkle.server.state.records import EPHEMERAL_PREFIX, RESERVED_NAME
from twinkle.server.tinker import convert
from twinkle.server.tinker.api import (
    EPHEMERAL_TTL_S,
    TinkerApi,
)
from twinkle.server.tinker.inflight import inflight_save
from twinkle.server.tinker.models import checkpoint_facts
from twinkle.server.web import read_json


def weights_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/save_weights")
    async def save_weights(request: Request) -> dict:
        call = await api.open_call(request, "save_weights")
        owner, body, model_id, seq_id = call.owner, call.body, call.model_id, call.seq_id

        def prepare():
            run = api.run_of(owner, model_id)
            name = validate_checkpoint_name(
                body.get("path") or f"step-{seq_id or uuid.uuid4().hex[:8]}"
            )
            if name.startswith(EPHEMERAL_PREFIX):
                raise BadRequest(f"path: {RESERVED_NAME}")
            ttl = validate_ttl(body.get("ttl_seconds"))  # before the save: a refusal saves nothing
            if not body.get("overwrite") and _exists(
                api, owner, run.training_run_id, f"weights/{name}"
            ):
                raise BadRequest(
                    f"checkpoint weights/{name} already exists; pass overwrite=True or another name"
                )

            async def run_call() -> dict:
                path = await api.save(owner, model_id, name, "weights", ttl)
                return {"path": convert.to_tinker_path(path), "type": "save_weights"}

            return run_call

        return await api.sequenced(call, prepare)

    @router.post("/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict:
        call = await api.open_call(request, "save_weights_for_sampler")
        owner, body, model_id, seq_id = call.owner, call.body, call.model_id, call.seq_id

        def prepare():
            run = api.run_of(owner, model_id)
            named = body.get("path") is not None
            if named and str(body["path"]).startswith(EPHEMERAL_PREFIX):
                raise BadRequest(f"path: {RESERVED_NAME}")
            name = validate_checkpoint_name(
                body["path"] if named else f"{EPHEMERAL_PREFIX}{seq_id}-{uuid.uuid4().hex[:8]}"
            )
            validate_ttl(body.get("ttl_seconds"))  # before the save: a refusal saves nothing
            api.backends.sampler(run.base_model) if not named else None
            if not named and body.get("kind") == "inflight":
                return inflight_save(api, owner, body, model_id, run)
            return _sampler_save(api, owner, body, model_id, run, name, named)

        return await api.sequenced(call, prepare)

    @router.post("/load_weights")
    async def load_weights(request: Request) -> dict:
        call = await api.open_call(request, "load_weights")
        owner, body, model_id = call.owner, call.body, call.model_id
        if body.get("session_id") is not None:
            return await _create_from_checkpoint(api, owner, request, body)

        def prepare():
            client = api.backends.model(api.run_of(owner, model_id).base_model)
            facts = checkpoint_facts(api.state, owner, body.get("path") or "")
            op = "resume_from_checkpoint" if body.get("optimizer") else "load"

            async def run_call() -> dict:
                await client.call(owner, op, {"adapter_name": model_id, "path": facts.path})
                return {
                    "path": convert.to_tinker_path(facts.path),
                    "model_id": model_id,
                    "type": "load_weights",
                }

            return run_call

        return await api.sequenced(call, prepare)

    @router.post("/weights_info")
    async def weights_info(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        facts = checkpoint_facts(api.state, owner, body.get("tinker_path") or "")
        return {"base_model": facts.base_model, "is_lora": True, **convert.lora_flags(facts.lora)}

    @router.post("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish(run_id: str, kind: str, name: str, request: Request) -> dict:
        """Upload the caller's own checkpoint to the ModelScope hub as
        ``<namespace>/<run>-<name>`` (token rule: :mod:`twinkle.server.hub`) and mark it public."""
        owner = api.ctx.authenticate(request.headers)
        record = api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
        hub = HubPublisher.from_config(api.ctx.config.hub)
        key = caller_key(request.headers, api.ctx.signer)
        repo_name = re.sub(r"[^A-Za-z0-9_.\-]", "-", f"{run_id}-{name}")[:96]

        def upload() -> dict:
            token = hub.token_for(key)
            return hub.upload(record.local_dir, hub.repo_id(token, repo_name), token)

        uploaded = await asyncio.to_thread(upload)
        api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", True)
        return {
            "published": convert.to_tinker_path(record.path),
            "repo_id": uploaded["hub_model_id"],
        }

    @router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish(run_id: str, kind: str, name: str, request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        record = api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", False)
        return {"unpublished": convert.to_tinker_path(record.path)}


def _exists(api: TinkerApi, owner: str, run_id: str, checkpoint_id: str) -> bool:
    try:
        api.state.get_checkpoint(owner, run_id, checkpoint_id)
    except Exception:  # noqa: BLE001 - NotFound
        return False
    return True


async def _create_from_checkpoint(api: TinkerApi, owner: str, request: Request, body: dict) -> dict:
    """``load_weights`` with ``session_id``/``model_seq_id``: a new model from a checkpoint."""
    session_id, seq = body.get("session_id"), body.get("model_seq_id")
    if not isinstance(seq, int):
        raise BadRequest("load_weights with session_id needs model_seq_id")
    api.state.get_session(owner, session_id)
    facts = checkpoint_facts(api.state, owner, body.get("path") or "")
    base_model = body.get("base_model") or facts.base_model
    if base_model != facts.base_model:
        raise BadRequest(f"checkpoint was trained on {facts.base_model}, not {base_model}")
    client = api.backends.model(base_model)
    model_id = f"{session_id}:train:{seq}"
    keys = api.dedupe_keys(request, "create_model", model_id)
    if rid := api.futures.find(owner, keys):
        return api.submitted(rid, model_id)
    op = "resume_from_checkpoint" if body.get("optimizer") else "load"

    async def run() -> dict:
        await api.create_adapter(
            owner,
            base_model,
            model_id,
            session_id,
            seq,
            dict(facts.lora),
            body.get("user_metadata"),
        )
        try:
            await client.call(owner, op, {"adapter_name": model_id, "path": facts.path})
        except Exception:
            await client.call(owner, "remove_adapter", {"adapter_name": model_id})
            raise
        return {
            "model_id": model_id,
            "path": convert.to_tinker_path(facts.path),
            "type": "load_weights",
        }

    return api.submitted(
        api.futures.submit(owner, "load_weights", run, model_id=model_id, dedupe=keys), model_id
    )


def _sampler_save(
    api: TinkerApi, owner: str, body: dict, model_id: str, run, name: str, named: bool
):
    """What ``save_weights_for_sampler`` runs in its turn: a named checkpoint, or an ephemeral one
    behind a new sampling session."""

    async def run_call() -> dict:
        ttl = body.get("ttl_seconds") if named else body.get("ttl_seconds") or EPHEMERAL_TTL_S
        path = await api.save(owner, model_id, name, "sampler_weights", ttl)
        if named:
            return {"path": convert.to_tinker_path(path), "type": "save_weights_for_sampler"}
        sid = (
            f"{run.session_id}:sample:{body.get('sampling_session_seq_id')}:{uuid.uuid4().hex[:8]}"
        )
        api.state.create_sampling_session(
            owner,
            run.session_id,
            base_model=run.base_model,
            model_path=path,
            sampling_session_id=sid,
        )
        return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

    return run_call
