"""The Tinker training calls: create a model, its facts, forward(_backward), optim_step, unload.

Each runs on the model deployment (tenant adapters, fused ``forward_backward``) as the model's
next future (:mod:`.futures`), in ``seq_id`` order; what can be refused is refused before it is
queued (a 400 now, not a failed future later).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tinker import types

from twinkle.server.process.threads import off_loop
from twinkle.server.tinker import convert, custom_loss, extensions, optimizers, wire
from twinkle.server.tinker import images as tinker_images
from twinkle.server.tinker.api import SequencedCall, TinkerApi
from twinkle.server.tinker.futures import Proto, body_digest
from twinkle.server.tinker.models import model_facts
from twinkle.server.tinker.stability import bind_sampler_logprobs, store_for
from twinkle.server.web.errors import BadRequest

OPTIMIZER = "adamw"  # the one optimizer family this server trains with


async def create_model(
    api: TinkerApi, owner: str, body: types.CreateModelRequest, idem: str | None
) -> dict:
    """A new LoRA adapter ``<session>:train:<seq>`` on ``base_model`` (a future)."""
    api.state.get_session(owner, body.session_id)
    api.backends.model(body.base_model)  # an unknown base model is a user error, now
    if body.optimizer_config.type != OPTIMIZER:
        raise BadRequest(
            f"optimizer_config.type {body.optimizer_config.type!r} is not supported; this server"
            f" trains with {OPTIMIZER}"
        )
    facts = await off_loop(model_facts, body.base_model)
    lora = body.lora_config.model_dump() if body.lora_config is not None else None
    config = convert.lora_config(lora, moe=facts.moe)
    max_rank = api.backends.max_lora_rank.get(body.base_model)
    if max_rank is not None and config["r"] > max_rank:  # refused now, not in the future
        raise BadRequest(
            f"lora_config.rank {config['r']} is over this server's max_lora_rank={max_rank}"
        )
    model_id = f"{body.session_id}:train:{body.model_seq_id}"
    keys = api.dedupe_keys(idem, "create_model", model_id)
    if rid := api.futures.find(owner, keys):
        return api.submitted(rid, model_id)

    async def run() -> dict:
        await api.create_adapter(
            owner,
            body.base_model,
            model_id,
            body.session_id,
            body.model_seq_id,
            config,
            body.user_metadata,
        )
        return {"model_id": model_id, "type": "create_model"}

    rid = api.futures.submit(owner, "create_model", run, model_id=model_id, dedupe=keys)
    return api.submitted(rid, model_id)


async def get_info(api: TinkerApi, owner: str, body: types.GetInfoRequest) -> dict:
    """``GetInfoResponse`` of the caller's model: its base model, rank and tokenizer."""
    run = api.run_of(owner, body.model_id)
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


async def forward_backward(
    api: TinkerApi,
    owner: str,
    msg: wire.WireForwardBackward,
    raw: bytes,
    body: bytes,
    idem: str | None,
) -> dict:
    """Run a decoded forward / forward_backward as the model's next sequenced call (``raw``: the
    body as sent, for resubmission dedupe; ``body``: decompressed, for provenance binding)."""
    if msg.loss_fn == "stable_reinforce":
        bind_sampler_logprobs(store_for(api), owner, msg.data, body)
    keys = api.dedupe_keys(idem, "forward_backward", msg.model_id, msg.seq_id, body_digest(raw))
    # A reference pass of the base model trains nothing: it runs as a forward.
    reference = extensions.take_disable_lora(msg)
    op = "forward_only" if msg.forward_only or reference else "forward_backward"
    existing = api.futures.find(owner, keys)
    call = SequencedCall(op, owner, msg.model_id, msg.seq_id, keys, existing)
    return await api.sequenced(call, lambda: _prepare_pass(api, owner, msg, op, reference))


async def _prepare_pass(
    api: TinkerApi, owner: str, msg: wire.WireForwardBackward, op: str, reference: bool
):
    """Check the pass now (400s before it is queued); returns what runs in its turn."""
    run = api.run_of(owner, msg.model_id)
    client = api.backends.model(run.base_model)
    vocab = (await off_loop(model_facts, run.base_model)).vocab_size
    # Image chunks -> image tokens + pixel_values (checked; a bad image is a 400).
    await off_loop(tinker_images.expand_datums, msg.data, run.base_model)
    if msg.loss_fn == "custom":
        features, loss = custom_loss.features_and_loss(api, owner, run, msg, vocab)
    else:
        features, loss = extensions.features_and_loss(msg, vocab)
    payload: dict[str, Any] = {"adapter_name": msg.model_id, "inputs": features, "loss": loss}
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


async def optim_step(
    api: TinkerApi, owner: str, body: types.OptimStepRequest, idem: str | None
) -> dict:
    """One AdamW step of the caller's model, after its earlier calls."""
    call = api.open_call(owner, "optim_step", body, idem)

    def prepare():
        client = api.backends.model(api.run_of(owner, body.model_id).base_model)
        params = optimizers.check_optim_params(body)

        async def run() -> dict:
            result = await client.call(
                owner, "tinker_optim_step", {"adapter_name": body.model_id, "adam_params": params}
            )
            return {"type": "optim_step", "metrics": result["metrics"]}

        return run

    return await api.sequenced(call, prepare)


async def unload_model(api: TinkerApi, owner: str, body: types.UnloadModelRequest) -> dict:
    """Remove the caller's adapter from the model deployment (a future)."""
    model_id = body.model_id
    client = api.backends.model(api.run_of(owner, model_id).base_model)

    async def run() -> dict:
        await client.call(owner, "remove_adapter", {"adapter_name": model_id})
        return {"model_id": model_id, "type": "unload_model"}

    return api.submitted(
        api.futures.submit(owner, "unload_model", run, model_id=model_id), model_id
    )


__all__ = ["create_model", "forward_backward", "get_info", "optim_step", "unload_model"]
