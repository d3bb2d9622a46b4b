"""The Tinker-compatible API (``/api/v1``): what the unmodified ``tinker`` SDK calls.

Thin routes over :mod:`tinker_futures` (ordered execution, retries, long-poll), :mod:`tinker_wire`
(protobuf) and :mod:`tinker_convert` (request shapes -> model and sampler payloads). Training
calls reach the model deployment (tenant adapters, fused ``forward_backward``); sampling calls the
sampler deployment. See TINKER_PROTOCOL.md for the contract.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from twinkle.server.context import ServerContext
from twinkle.server.errors import BadRequest, PayloadTooLarge
from twinkle.server.gateway import tinker_convert as convert
from twinkle.server.gateway import tinker_wire as wire
from twinkle.server.gateway.backends import Backends
from twinkle.server.gateway.tinker_futures import PROTOBUF, Proto, TinkerFutures, body_digest
from twinkle.server.gateway.tinker_models import checkpoint_facts, model_facts, publish_to_hub
from twinkle.server.model import tinker_ops
from twinkle.server.state.paths import validate_checkpoint_name
from twinkle.server.web import read_json

LONG_POLL_S = 25.0
EPHEMERAL_TTL_S = 24 * 3600.0
CLIENT_CONFIG = {
    "use_pyqwest_transport": False,
    "pjwt_auth_enabled": False,
    "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": True,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


class TinkerApi:
    """The state the routes share: server context, backends, futures."""

    def __init__(self, ctx: ServerContext, backends: Backends) -> None:
        self.ctx, self.backends, self.state = ctx, backends, ctx.state
        self.futures = TinkerFutures(ctx.state)
        self.max_bytes = ctx.server_args.max_request_bytes

    # -- helpers -------------------------------------------------------------------------------
    def run_of(self, owner: str, model_id: Any):
        if not isinstance(model_id, str) or not model_id:
            raise BadRequest("missing model_id")
        return self.state.get_run(owner, model_id)

    def dedupe_keys(self, request: Request, *parts: Any) -> list[tuple]:
        keys = [("call", *parts)] if all(p is not None for p in parts[1:]) else []
        idem = request.headers.get("x-idempotency-key")
        return ([("idem", idem)] if idem else []) + keys

    def submitted(self, rid: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"request_id": rid, **({"model_id": model_id} if model_id else {}), **extra}

    async def refuse(self, model_id: str | None, seq_id: Any, exc: Exception) -> None:
        """A call refused before it ran still uses up its seq_id (later ones must not wait for it)."""
        if model_id and isinstance(seq_id, int):
            await self.futures.lane(model_id).skip(seq_id)
        raise exc

    async def read_body(self, request: Request) -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > self.max_bytes:
                raise PayloadTooLarge(f"request body is over the limit of {self.max_bytes} bytes")
        return bytes(body)

    def sampler_target(self, owner: str, body: dict[str, Any]) -> tuple[str, str | None]:
        """(base model, twinkle:// adapter path or None) of a sampling request."""
        sid = body.get("sampling_session_id")
        if sid:
            record = self.state.get_sampling_session(owner, sid)
            return record.base_model, record.model_path
        if body.get("model_path"):
            facts = checkpoint_facts(self.state, owner, body["model_path"])
            return facts.base_model, facts.path
        if body.get("base_model"):
            return body["base_model"], None
        raise BadRequest("asample needs sampling_session_id, model_path or base_model")

    async def save(self, owner: str, model_id: str, name: str, kind: str, ttl: Any) -> str:
        path = (
            await self.backends.model(self.run_of(owner, model_id).base_model).call(
                owner,
                "save",
                {
                    "adapter_name": model_id,
                    "name": name,
                    "kind": "sampler" if kind == "sampler_weights" else kind,
                    "save_optimizer": kind == "weights",
                },
            )
        )["path"]
        if ttl is not None:
            run_id, _, rest = path.split("://", 1)[1].partition("/")
            self.state.set_checkpoint_ttl(owner, run_id, rest, float(ttl))
        return path

    async def create_adapter(
        self,
        owner: str,
        base_model: str,
        model_id: str,
        session_id: str,
        seq: int,
        config: dict[str, Any],
        user_metadata: Any,
    ) -> None:
        await self.backends.model(base_model).call(
            owner,
            "add_adapter_to_model",
            {
                "adapter_name": model_id,
                "config": config,
                "training_run_id": model_id,
                "session_id": session_id,
                "model_seq_id": seq,
                "user_metadata": user_metadata or {},
            },
        )


def create_tinker_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """Every Tinker endpoint except the shared ones (sessions, runs, checkpoints) of routes_common."""
    api = TinkerApi(ctx, backends)
    router = APIRouter()
    _config_routes(router, api)
    _training_routes(router, api)
    _weights_routes(router, api)
    _sampling_routes(router, api)
    _future_routes(router, api)
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
        api.ctx.authenticate(request.headers)
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
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise BadRequest(
                f"optimizer {optimizer!r} is not supported; this server trains with adamw"
            )
        config = convert.lora_config(body.get("lora_config"))
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
        facts = await asyncio.to_thread(model_facts, run.base_model)
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
        if "json" in request.headers.get("content-type", ""):
            raise BadRequest(
                "forward_backward takes a protobuf ForwardBackwardRequest (application/x-protobuf)"
            )
        msg = wire.decode_forward_backward(
            wire.decompress(raw, request.headers.get("content-encoding"), api.max_bytes)
        )
        keys = api.dedupe_keys(
            request, "forward_backward", msg.model_id, msg.seq_id, body_digest(raw)
        )
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, msg.model_id)
        try:
            run = api.run_of(owner, msg.model_id)
            client = api.backends.model(run.base_model)
            loss = convert.check_loss(msg.loss_fn, msg.loss_fn_config)
            vocab = (await asyncio.to_thread(model_facts, run.base_model)).vocab_size
            features = convert.datums_to_features(msg.data, msg.loss_fn, vocab)
        except Exception as exc:
            await api.refuse(msg.model_id, msg.seq_id, exc)
        op = "forward_only" if msg.forward_only else "forward_backward"
        payload = {"adapter_name": msg.model_id, "inputs": features, "loss": loss}

        async def run_call() -> Proto:
            result = await client.call(owner, op, payload)
            outputs = [{"logprobs": np.asarray(lp, dtype=np.float32)} for lp in result["logprobs"]]
            metrics = {
                "loss:sum": float(result["loss"]),
                "num_tokens:sum": float(result.get("num_tokens", 0)),
            }
            return Proto(wire.encode_forward_backward_output(outputs, metrics))

        rid = api.futures.submit(
            owner, op, run_call, model_id=msg.model_id, seq_id=msg.seq_id, dedupe=keys
        )
        return api.submitted(rid, msg.model_id)

    @router.post("/optim_step")
    async def optim_step(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        model_id, seq_id = body.get("model_id"), body.get("seq_id")
        keys = api.dedupe_keys(request, "optim_step", model_id, seq_id, _digest(body))
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, model_id)
        try:
            client = api.backends.model(api.run_of(owner, model_id).base_model)
            params = tinker_ops.check_adam_params(
                body.get("adam_params") or body.get("optim_params") or {}
            )
        except Exception as exc:
            await api.refuse(model_id, seq_id, exc)

        async def run() -> dict:
            result = await client.call(
                owner, "tinker_optim_step", {"adapter_name": model_id, "adam_params": params}
            )
            return {"type": "optim_step", "metrics": result["metrics"]}

        return api.submitted(
            api.futures.submit(
                owner, "optim_step", run, model_id=model_id, seq_id=seq_id, dedupe=keys
            ),
            model_id,
        )

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


def _weights_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/save_weights")
    async def save_weights(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        model_id, seq_id = body.get("model_id"), body.get("seq_id")
        keys = api.dedupe_keys(request, "save_weights", model_id, seq_id, _digest(body))
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, model_id)
        try:
            run = api.run_of(owner, model_id)
            name = validate_checkpoint_name(
                body.get("path") or f"step-{seq_id or uuid.uuid4().hex[:8]}"
            )
            if not body.get("overwrite") and _exists(
                api, owner, run.training_run_id, f"weights/{name}"
            ):
                raise BadRequest(
                    f"checkpoint weights/{name} already exists; pass overwrite=True or another name"
                )
        except Exception as exc:
            await api.refuse(model_id, seq_id, exc)

        async def run_call() -> dict:
            path = await api.save(owner, model_id, name, "weights", body.get("ttl_seconds"))
            return {"path": convert.to_tinker_path(path), "type": "save_weights"}

        return api.submitted(
            api.futures.submit(
                owner, "save_weights", run_call, model_id=model_id, seq_id=seq_id, dedupe=keys
            ),
            model_id,
        )

    @router.post("/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        model_id, seq_id = body.get("model_id"), body.get("seq_id")
        keys = api.dedupe_keys(request, "save_weights_for_sampler", model_id, seq_id, _digest(body))
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, model_id)
        try:
            run = api.run_of(owner, model_id)
            named = body.get("path") is not None
            name = validate_checkpoint_name(
                body["path"] if named else f"ephemeral-{seq_id}-{uuid.uuid4().hex[:8]}"
            )
            api.backends.sampler(run.base_model) if not named else None
        except Exception as exc:
            await api.refuse(model_id, seq_id, exc)

        async def run_call() -> dict:
            ttl = body.get("ttl_seconds") if named else body.get("ttl_seconds") or EPHEMERAL_TTL_S
            path = await api.save(owner, model_id, name, "sampler_weights", ttl)
            if named:
                return {"path": convert.to_tinker_path(path), "type": "save_weights_for_sampler"}
            sid = f"{run.session_id}:sample:{body.get('sampling_session_seq_id')}:{uuid.uuid4().hex[:8]}"
            api.state.create_sampling_session(
                owner,
                run.session_id,
                base_model=run.base_model,
                model_path=path,
                sampling_session_id=sid,
            )
            return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

        return api.submitted(
            api.futures.submit(
                owner,
                "save_weights_for_sampler",
                run_call,
                model_id=model_id,
                seq_id=seq_id,
                dedupe=keys,
            ),
            model_id,
        )

    @router.post("/load_weights")
    async def load_weights(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        if body.get("session_id") is not None:
            return await _create_from_checkpoint(api, owner, request, body)
        model_id, seq_id = body.get("model_id"), body.get("seq_id")
        keys = api.dedupe_keys(request, "load_weights", model_id, seq_id, _digest(body))
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, model_id)
        try:
            client = api.backends.model(api.run_of(owner, model_id).base_model)
            facts = checkpoint_facts(api.state, owner, body.get("path") or "")
        except Exception as exc:
            await api.refuse(model_id, seq_id, exc)
        op = "resume_from_checkpoint" if body.get("optimizer") else "load"

        async def run_call() -> dict:
            await client.call(owner, op, {"adapter_name": model_id, "path": facts.path})
            return {
                "path": convert.to_tinker_path(facts.path),
                "model_id": model_id,
                "type": "load_weights",
            }

        return api.submitted(
            api.futures.submit(
                owner, "load_weights", run_call, model_id=model_id, seq_id=seq_id, dedupe=keys
            ),
            model_id,
        )

    @router.post("/weights_info")
    async def weights_info(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        facts = checkpoint_facts(api.state, owner, body.get("tinker_path") or "")
        return {"base_model": facts.base_model, "is_lora": True, **convert.lora_flags(facts.lora)}

    @router.post("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish(run_id: str, kind: str, name: str, request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        record = api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
        token = os.environ.get("MODELSCOPE_API_TOKEN") or os.environ.get("TWINKLE_HUB_TOKEN")
        if not token:
            raise BadRequest(
                "cannot publish: no hub token is configured on this server "
                "(set MODELSCOPE_API_TOKEN for the server process)"
            )
        repo_name = re.sub(r"[^A-Za-z0-9_.\-]", "-", f"{run_id}-{name}")[:96]
        repo_id = await asyncio.to_thread(
            publish_to_hub,
            record.local_dir,
            repo_name,
            token,
            os.environ.get("TWINKLE_HUB_NAMESPACE"),
        )
        api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", True)
        return {"published": convert.to_tinker_path(record.path), "repo_id": repo_id}

    @router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish(run_id: str, kind: str, name: str, request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        record = api.state.set_checkpoint_public(owner, run_id, f"{kind}/{name}", False)
        return {"unpublished": convert.to_tinker_path(record.path)}


def _digest(body: dict) -> str:
    return body_digest(json.dumps(body, sort_keys=True, default=str))


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


def _sampling_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        session_id, seq = body.get("session_id"), body.get("sampling_session_seq_id")
        if not isinstance(session_id, str) or not isinstance(seq, int):
            raise BadRequest("create_sampling_session needs session_id and sampling_session_seq_id")
        base_model, path = body.get("base_model"), None
        if body.get("model_path"):
            facts = checkpoint_facts(api.state, owner, body["model_path"])
            if base_model and base_model != facts.base_model:
                raise BadRequest(
                    f"{body['model_path']} was trained on {facts.base_model}, not {base_model}"
                )
            base_model, path = facts.base_model, facts.path
        if not base_model:
            raise BadRequest("create_sampling_session needs base_model or model_path")
        api.backends.sampler(base_model)
        sid = f"{session_id}:sample:{seq}"
        try:
            record = api.state.get_sampling_session(owner, sid)  # a retried request
        except Exception:  # noqa: BLE001 - NotFound: create it
            record = api.state.create_sampling_session(
                owner, session_id, base_model=base_model, model_path=path, sampling_session_id=sid
            )
        return {
            "sampling_session_id": record.sampling_session_id,
            "type": "create_sampling_session",
        }

    @router.get("/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        record = api.state.get_sampling_session(owner, sampler_id)
        path = convert.to_tinker_path(record.model_path) if record.model_path else None
        return {
            "sampler_id": record.sampling_session_id,
            "base_model": record.base_model,
            "model_path": path,
        }

    @router.post("/asample")
    async def asample(request: Request) -> dict:
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        num_samples = body.get("num_samples", 1)
        keys = api.dedupe_keys(
            request, "asample", body.get("sampling_session_id"), body.get("seq_id")
        )
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, num_samples))
        base_model, adapter = api.sampler_target(owner, body)
        client = api.backends.sampler(base_model)
        tokens = convert.prompt_tokens(body.get("prompt") or {})
        convert.check_prompt(tokens, (await asyncio.to_thread(model_facts, base_model)).vocab_size)
        if (
            body.get("topk_prompt_logprobs")
            or body.get("topk_sample_logprobs")
            or body.get("target_prompt_logprobs")
        ):
            raise BadRequest("top-k and target prompt logprobs are not supported by this server")
        want_prompt_lp = bool(body.get("prompt_logprobs"))
        params = convert.sampling_params(
            body.get("sampling_params") or {}, num_samples, want_prompt_lp
        )
        payload = {"inputs": [tokens], "adapter_uri": adapter, "sampling_params": params}

        async def run() -> Proto:
            result = (await client.call(owner, "sample", payload))["results"][0]
            prompt_lp = result.get("prompt_logprobs") if want_prompt_lp else None
            return Proto(wire.encode_sample_response(result["sequences"], prompt_lp))

        rid = api.futures.submit(owner, "sample", run, dedupe=keys)
        return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, num_samples))


def _sequence_ids(rid: str, num_samples: int) -> list[str]:
    return [f"{rid}:{i}" for i in range(int(num_samples))]


def _future_routes(router: APIRouter, api: TinkerApi) -> None:
    @router.post("/retrieve_future")
    async def retrieve_future(request: Request):
        owner = api.ctx.authenticate(request.headers)
        body = await read_json(request, api.max_bytes)
        rid = body.get("request_id")
        if not isinstance(rid, str):
            raise BadRequest("retrieve_future needs request_id")
        record = await api.futures.wait(owner, rid, LONG_POLL_S)
        if record.status == "pending":
            return {"type": "try_again", "request_id": rid, "queue_state": record.queue_state}
        if record.status == "error":
            return JSONResponse({"error": record.error.message, "category": record.error.category})
        if record.content_type == PROTOBUF:
            return Response(base64.b64decode(record.result_b64 or ""), media_type=PROTOBUF)
        return record.result


__all__ = ["TinkerApi", "create_tinker_router"]
