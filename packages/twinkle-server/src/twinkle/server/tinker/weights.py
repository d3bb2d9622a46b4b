"""Tinker weights: save, save for sampler, load (or create from a checkpoint), info, publish."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

from tinker import types

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
from twinkle.server.tinker.request_fields import LoadWeightsRequest
from twinkle.server.web.errors import BadRequest


async def save_weights(
    api: TinkerApi, owner: str, body: types.SaveWeightsRequest, idem: str | None
) -> dict:
    """``weights/<path>`` with the optimizer state (a sequenced call)."""
    call = api.open_call(owner, "save_weights", body, idem)
    model_id = body.model_id

    def prepare():
        run = api.run_of(owner, model_id)
        name = validate_checkpoint_name(body.path or f"step-{body.seq_id or uuid.uuid4().hex[:8]}")
        if name.startswith(EPHEMERAL_PREFIX):
            raise BadRequest(f"path: {RESERVED_NAME}")
        ttl = validate_ttl(body.ttl_seconds)  # before the save: a refusal saves nothing
        if not body.overwrite and _exists(api, owner, run.training_run_id, f"weights/{name}"):
            raise BadRequest(
                f"checkpoint weights/{name} already exists; pass overwrite=True or another name"
            )

        async def run_call() -> dict:
            path = await api.save(owner, model_id, name, "weights", ttl)
            return {"path": convert.to_tinker_path(path), "type": "save_weights"}

        return run_call

    return await api.sequenced(call, prepare)


async def save_weights_for_sampler(
    api: TinkerApi, owner: str, body: types.SaveWeightsForSamplerRequest, idem: str | None
) -> dict:
    """``sampler_weights/<path>``; without a path an ephemeral snapshot behind a new sampling
    session, or (``kind="inflight"``) the live adapter handed to the sampler."""
    call = api.open_call(owner, "save_weights_for_sampler", body, idem)
    model_id = body.model_id

    def prepare():
        run = api.run_of(owner, model_id)
        named = body.path is not None
        if named and body.path.startswith(EPHEMERAL_PREFIX):
            raise BadRequest(f"path: {RESERVED_NAME}")
        name = validate_checkpoint_name(
            body.path if named else f"{EPHEMERAL_PREFIX}{body.seq_id}-{uuid.uuid4().hex[:8]}"
        )
        validate_ttl(body.ttl_seconds)  # before the save: a refusal saves nothing
        if not named:
            api.backends.sampler(run.base_model)
            if body.kind == "inflight":
                return inflight_save(api, owner, body, model_id, run)
        return _sampler_save(api, owner, body, model_id, run, name, named)

    return await api.sequenced(call, prepare)


async def load_weights(
    api: TinkerApi, owner: str, body: LoadWeightsRequest, idem: str | None
) -> dict:
    """Load a checkpoint into the caller's model (a sequenced call), or, with ``session_id``,
    create a new model from it."""
    if body.session_id is not None:
        return await _create_from_checkpoint(api, owner, body, idem)
    call = api.open_call(owner, "load_weights", body, idem)
    model_id = body.model_id

    def prepare():
        client = api.backends.model(api.run_of(owner, model_id).base_model)
        facts = checkpoint_facts(api.state, owner, body.path)
        op = "resume_from_checkpoint" if body.optimizer else "load"

        async def run_call() -> dict:
            await client.call(owner, op, {"adapter_name": model_id, "path": facts.path})
            return {
                "path": convert.to_tinker_path(facts.path),
                "model_id": model_id,
                "type": "load_weights",
            }

        return run_call

    return await api.sequenced(call, prepare)


def weights_info(api: TinkerApi, owner: str, tinker_path: str) -> dict:
    """``WeightsInfoResponse``: the base model and LoRA flags of a checkpoint."""
    facts = checkpoint_facts(api.state, owner, tinker_path)
    return {"base_model": facts.base_model, "is_lora": True, **convert.lora_flags(facts.lora)}


async def publish(
    api: TinkerApi, owner: str, key: str | None, run_id: str, kind: str, name: str
) -> dict:
    """Upload the caller's own checkpoint to the ModelScope hub as ``<namespace>/<run>-<name>``
    (token rule: :mod:`twinkle.server.hub`; ``key``: the caller's API key) and mark it public."""
    record = api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
    hub = HubPublisher.from_config(api.ctx.config.hub)
    repo_name = re.sub(r"[^A-Za-z0-9_.\-]", "-", f"{run_id}-{name}")[:96]

    def upload() -> dict:
        token = hub.token_for(key)
        return hub.upload(record.local_dir, hub.repo_id(token, repo_name), token)

    uploaded = await asyncio.to_thread(upload)
    api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", True)
    return {"published": convert.to_tinker_path(record.path), "repo_id": uploaded["hub_model_id"]}


def unpublish(api: TinkerApi, owner: str, run_id: str, kind: str, name: str) -> dict:
    record = api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", False)
    return {"unpublished": convert.to_tinker_path(record.path)}


def _exists(api: TinkerApi, owner: str, run_id: str, checkpoint_id: str) -> bool:
    try:
        api.state.get_checkpoint(owner, run_id, checkpoint_id)
    except Exception:  # noqa: BLE001 - NotFound
        return False
    return True


async def _create_from_checkpoint(
    api: TinkerApi, owner: str, body: LoadWeightsRequest, idem: str | None
) -> dict:
    """``load_weights`` with ``session_id``/``model_seq_id``: a new model from a checkpoint."""
    session_id, seq = body.session_id, body.model_seq_id
    if seq is None:
        raise BadRequest("load_weights with session_id needs model_seq_id")
    api.state.get_session(owner, session_id)
    facts = checkpoint_facts(api.state, owner, body.path)
    base_model = body.base_model or facts.base_model
    if base_model != facts.base_model:
        raise BadRequest(f"checkpoint was trained on {facts.base_model}, not {base_model}")
    client = api.backends.model(base_model)
    model_id = f"{session_id}:train:{seq}"
    keys = api.dedupe_keys(idem, "create_model", model_id)
    if rid := api.futures.find(owner, keys):
        return api.submitted(rid, model_id)
    op = "resume_from_checkpoint" if body.optimizer else "load"

    async def run() -> dict:
        await api.create_adapter(
            owner,
            base_model,
            model_id,
            session_id,
            seq,
            dict(facts.lora),
            body.user_metadata,
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
    api: TinkerApi,
    owner: str,
    body: types.SaveWeightsForSamplerRequest,
    model_id: str,
    run: Any,
    name: str,
    named: bool,
):
    """What ``save_weights_for_sampler`` runs in its turn: a named checkpoint, or an ephemeral one
    behind a new sampling session."""

    async def run_call() -> dict:
        ttl = body.ttl_seconds if named else body.ttl_seconds or EPHEMERAL_TTL_S
        path = await api.save(owner, model_id, name, "sampler_weights", ttl)
        if named:
            return {"path": convert.to_tinker_path(path), "type": "save_weights_for_sampler"}
        sid = f"{run.session_id}:sample:{body.sampling_session_seq_id}:{uuid.uuid4().hex[:8]}"
        api.state.create_sampling_session(
            owner,
            run.session_id,
            base_model=run.base_model,
            model_path=path,
            sampling_session_id=sid,
        )
        return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

    return run_call
