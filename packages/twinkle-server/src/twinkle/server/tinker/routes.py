"""The Tinker-compatible API (``/api/v1``): what the unmodified ``tinker`` SDK calls.

Thin routes over :mod:`.futures` (ordered execution, retries, long-poll), :mod:`.wire`
(protobuf) and :mod:`.convert` (request shapes -> model and sampler payloads). Training
calls reach the model deployment (tenant adapters, fused ``forward_backward``); sampling calls the
sampler deployment. See TINKER_PROTOCOL.md for the contract.
"""

from __future__ import annotations

import json

import numpy as np
from fastapi import APIRouter, Depends, Request

from twinkle.server.context import ServerContext
from twinkle.server.errors import BadRequest
from twinkle.server.gateway.backends import Backends
from twinkle.server.threads import off_loop
from twinkle.server.tinker import convert, custom_loss, extensions, optimizers, wire, wire_json
from twinkle.server.tinker import images as tinker_images
from twinkle.server.tinker.api import CLIENT_CONFIG, SequencedCall, TinkerApi
from twinkle.server.tinker.futures import Proto, body_digest
from twinkle.server.tinker.models import model_facts
from twinkle.server.tinker.request_fields import note_unknown_fields
from twinkle.server.tinker.rest import rest_routes
from twinkle.server.tinker.sampling import future_routes, sampling_routes
from twinkle.server.tinker.stability import bind_sampler_logprobs, store_for
from twinkle.server.tinker.weights import weights_routes
from twinkle.server.tinker.weights_external import weights_external_routes
from twinkle.server.web import read_json


def create_tinker_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """Every Tinker endpoint except the shared ones (sessions, runs, checkpoints) of routes_common."""
    api = TinkerApi(ctx, backends)
    router = APIRouter(dependencies=[Depends(note_unknown_fields)])
    _config_routes(router, api)
    _training_routes(router, api)
    custom_loss.custom_loss_routes(router, api)
    weights_routes(router, api)
    weights_external_routes(router, api)
    sampling_routes(router, api)
    future_routes(router, api)
    rest_routes(router, api)
    router.tinker_api = api  # type: ignore[attr-defined]  # for tests and benchmarks
    return router


def _config_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/client/config")
    async def client_config(request: Request) -> dict:
        api.ctx.authenticate(request.headers)
        return dict(CLIENT_CONFIG)

    @router.post("/client/dynamic_config")
    async def dynamic_config(request: Request) -> dict:
        api.ctx.authenticate(request.headers)
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @router.post("/telemetry")
    async def telemetry(request: Request) -> dict:
        api.ctx.authenticate(request.headers)
        await api.read_body(request)
        return {"status": "accepted"}

    @router.post("/cancel_future")
    async def cancel_future(request: Request) -> dict:
        """Accepted and ignored (``sample_cancel_enabled`` is off); another key's future is
        unknown (404), as on every route taking an id."""
        owner = api.ctx.authenticate(request.headers)
        rid = (await read_json(request, api.max_bytes)).get("request_id")
        if isinstance(rid, str):
            api.state.get_future(owner, rid)
        return {}


def _training_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/create_model")
    async def create_model(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        session_id, seq, base_model = (
            body.get("session_id"),
            body.get("model_seq_id"),
            body.get("base_model"),
        )
        if (
            not isinstance(session_id, str)
            or not isinstance(seq, int)
            or not isinstance(base_model, str)
        ):
            raise BadRequest("create_model needs session_id, model_seq_id and base_model")
        api.state.get_session(owner, session_id)
        api.backends.model(base_model)  # an unknown base model is a user error, now
        optimizer_config = body.get("optimizer_config") or {}
        if not isinstance(optimizer_config, dict):
            raise BadRequest("optimizer_config must be an object")
        optimizer = optimizer_config.get("type", "adamw")
        if optimizer != "adamw":
            raise BadRequest(
                f"optimizer_config.type {optimizer!r} is not supported; this server trains with"
                " adamw"
            )
        facts = await off_loop(model_facts, base_model)
        config = convert.lora_config(body.get("lora_config"), moe=facts.moe)
        max_rank = api.backends.max_lora_rank.get(base_model)
        if max_rank is not None and config["r"] > max_rank:  # refused now, not in the future
            raise BadRequest(
                f"lora_config.rank {config['r']} is over this server's max_lora_rank={max_rank}"
            )
        model_id = f"{session_id}:train:{seq}"
        keys = api.dedupe_keys(request, "create_model", model_id)
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, model_id)

        async def run() -> dict:
            await api.create_adapter(
                owner, base_model, model_id, session_id, seq, config, body.get("user_metadata")
            )
            return {"model_id": model_id, "type": "create_model"}

        return api.submitted(
            api.futures.submit(owner, "create_model", run, model_id=model_id, dedupe=keys), model_id
        )

    @router.post("/get_info")
    async def get_info(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        run = api.run_of(owner, body.get("model_id"))
        facts = await off_loop(model_facts, run.base_model)
        return {
            "type": "get_info",
            "model_id": run.training_run_id,
            "is_lora": True,
            "lora_rank": run.lora_rank,
            "model_name": run.base_model,
            "model_data": {
                "arch": facts.arch,
                "model_name": run.base_model,
                "tokenizer_id": facts.tokenizer_id,
            },
        }

    @router.post("/forward_backward")
    async def forward_backward(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        raw = await api.read_body(request)
        if "json" in request.headers.get("content-type", ""):  # SDKs before 0.27
            body = raw
            msg = wire_json.decode_forward_backward(_json(raw), forward_only=False)
        else:
            body = wire.decompress(raw, request.headers.get("content-encoding"), api.max_bytes)
            msg = wire.decode_forward_backward(body)
        return await _training_call(api, request, owner, msg, raw, body)

    @router.post("/forward")
    async def forward(request: Request) -> dict:
        """``ForwardRequest`` as JSON: how SDKs before 0.27 ask for a forward pass."""
        owner = api.ctx.authenticate(request.headers)
        raw = await api.read_body(request)
        msg = wire_json.decode_forward_backward(_json(raw), forward_only=True)
        return await _training_call(api, request, owner, msg, raw, raw)

    @router.post("/optim_step")
    async def optim_step(request: Request) -> dict:
        call = await api.open_call(request, "optim_step")
        owner, body, model_id = call.owner, call.body, call.model_id

        def prepare():
            client = api.backends.model(api.run_of(owner, model_id).base_model)
            params = optimizers.check_optim_params(body)

            async def run() -> dict:
                result = await client.call(
                    owner, "tinker_optim_step", {"adapter_name": model_id, "adam_params": params}
                )
                return {"type": "optim_step", "metrics": result["metrics"]}

            return run

        return await api.sequenced(call, prepare)

    @router.post("/unload_model")
    async def unload_model(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        model_id = body.get("model_id")
        client = api.backends.model(api.run_of(owner, model_id).base_model)

        async def run() -> dict:
            await client.call(owner, "remove_adapter", {"adapter_name": model_id})
            return {"model_id": model_id, "type": "unload_model"}

        return api.submitted(
            api.futures.submit(owner, "unload_model", run, model_id=model_id), model_id
        )


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None


async def _training_call(
    api: TinkerApi,
    request: Request,
    owner: str,
    msg: wire.WireForwardBackward,
    raw: bytes,
    body: bytes,
) -> dict:
    """Run a decoded forward / forward_backward as the model's next sequenced call (``raw``: the
    body as sent, for resubmission dedupe; ``body``: decompressed, for provenance binding)."""
    if msg.loss_fn == "stable_reinforce":
        bind_sampler_logprobs(store_for(api), owner, msg.data, body)
    keys = api.dedupe_keys(request, "forward_backward", msg.model_id, msg.seq_id, body_digest(raw))
    # A reference pass of the base model trains nothing: it runs as a forward.
    reference = extensions.take_disable_lora(msg)
    op = "forward_only" if msg.forward_only or reference else "forward_backward"
    existing = api.futures.find(owner, keys)
    call = SequencedCall(op, owner, {}, msg.model_id, msg.seq_id, keys, existing)

    async def prepare():
        run = api.run_of(owner, msg.model_id)
        client = api.backends.model(run.base_model)
        vocab = (await off_loop(model_facts, run.base_model)).vocab_size
        # Image chunks -> image tokens + pixel_values (checked; a bad image is a 400).
        await off_loop(tinker_images.expand_datums, msg.data, run.base_model)
        if msg.loss_fn == "custom":
            features, loss = custom_loss.features_and_loss(api, owner, run, msg, vocab)
        else:
            features, loss = extensions.features_and_loss(msg, vocab)
        payload = {"adapter_name": msg.model_id, "inputs": features, "loss": loss}
        if reference:
            payload["disable_lora"] = True

        async def run_call() -> Proto:
            result = await client.call(owner, op, payload)
            tokens = int(result.get("num_tokens", 0))
            api.state.count_usage(owner, "training", tokens, run.base_model, run.session_id)
            outputs = [{"logprobs": np.asarray(lp, dtype=np.float32)} for lp in result["logprobs"]]
            loss_value = (
                extensions.reference_loss(msg, result["logprobs"]) if reference else result["loss"]
            )
            metrics = {
                "loss:sum": float(loss_value),
                "num_tokens:sum": float(result.get("num_tokens", 0)),
                **custom_loss.custom_metrics(result),
                **extensions.loss_metrics(loss, result),
            }
            return Proto(wire.encode_forward_backward_output(outputs, metrics))

        return run_call

    return await api.sequenced(call, prepare)


__all__ = ["TinkerApi", "create_tinker_router"]
