"""Tinker routes for sampling sessions, ``asample`` and ``retrieve_future`` (the long poll)."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from twinkle.server.errors import BadRequest, Gone
from twinkle.server.state._futures import ORPHANED
from twinkle.server.threads import off_loop
from twinkle.server.tinker import convert, sample_fields, stability, wire, wire_json
from twinkle.server.tinker import images as tinker_images
from twinkle.server.tinker.admin import count_sample_usage
from twinkle.server.tinker.api import (
    LONG_POLL_S,
    TinkerApi,
)
from twinkle.server.tinker.futures import PROTOBUF, Proto
from twinkle.server.tinker.models import checkpoint_facts, model_facts
from twinkle.server.tinker.session_futures import sample_target
from twinkle.server.web import read_json


def sampling_routes(router: APIRouter, api: TinkerApi) -> None:
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
        if not isinstance(base_model, str):
            raise BadRequest(f"base_model must be a string, got {type(base_model).__name__}")
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
        base_model, adapter = api.sampler_target(owner, body)
        client = api.backends.sampler(base_model)
        # Checked before the dedupe look-up too: a retry is answered with one id per sample.
        want_prompt_lp = bool(body.get("prompt_logprobs"))
        params = convert.sampling_params(
            body.get("sampling_params"),
            num_samples,
            want_prompt_lp,
            api.backends.sample_limits.get(base_model),
        )
        keys = api.dedupe_keys(
            request, "asample", body.get("sampling_session_id"), body.get("seq_id")
        )
        if rid := api.futures.find(owner, keys):
            return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, num_samples))
        tokens, images = await off_loop(
            tinker_images.prompt_inputs, body.get("prompt") or {}, base_model
        )
        convert.check_prompt(tokens, (await off_loop(model_facts, base_model)).vocab_size)
        extra, target_layout = sample_fields.sampler_params(body, len(tokens))
        params.update(extra)
        prompt = tokens if images is None else {"input_ids": tokens, **images}
        payload = {"inputs": [prompt], "adapter_uri": adapter, "sampling_params": params}

        async def run() -> Proto:
            result = (await client.call(owner, "sample", payload))["results"][0]
            count_sample_usage(api.state, owner, base_model, body, tokens, result["sequences"])
            prompt_lp = result.get("prompt_logprobs") if want_prompt_lp else None
            if body.get("record_stability_info"):
                ids = _sequence_ids(rid, num_samples)
                stability.record_samples(stability.store_for(api), owner, ids, result["sequences"])
            data = wire.encode_sample_response(result["sequences"], prompt_lp)
            return Proto(sample_fields.add_to_response(data, result, extra, target_layout))

        target = sample_target(body.get("sampling_session_id"), body.get("seq_id"))
        rid = api.futures.submit(owner, "sample", run, model_id=target, ordered=False, dedupe=keys)
        return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, num_samples))


def _sequence_ids(rid: str, num_samples: int) -> list[str]:
    return [f"{rid}:{i}" for i in range(int(num_samples))]


def future_routes(router: APIRouter, api: TinkerApi) -> None:
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
            if record.kind == "sample" and record.error.message == ORPHANED:
                # A sample changes no state, so running it again is safe: the SDK's sampling
                # client answers a 410 on its future by resubmitting the request itself
                # (tinker.lib.api_future_impl: RetryableException, retried by RetryHandler).
                raise Gone(f"sample {rid}: {ORPHANED}")
            return JSONResponse({"error": record.error.message, "category": record.error.category})
        if record.content_type == PROTOBUF:
            data = base64.b64decode(record.result_b64 or "")
            if not wire_json.wants_protobuf(request.headers):  # an SDK before 0.27
                return await off_loop(wire_json.result_as_json, record.kind, data)
            return Response(data, media_type=PROTOBUF)
        return record.result
