"""``save_weights_and_get_sampling_client(kind="inflight")``: sampling from the live adapter.

Design: an inflight save hands the sampler the tenant's adapter state **in memory**. The model
deployment copies the live LoRA tensors out of the training model (``adapter_tensors``), the
gateway passes them to the sampler deployment (``publish_adapter``, see
:mod:`twinkle.server.gateway.routes_live_adapter`), which loads them into its
adapter pool under the key ``inflight://<owner>/<model_id>`` (the key scheme is the sampler's
protocol, :mod:`twinkle.server.sampler.protocol`) and drops what that key held before.
No checkpoint file is written and no checkpoint record is created.

The SDK's contract (``tinker.types.SamplingClientKind``) holds: every inflight client of one model
shares one mutable target; a later inflight save updates it for old and new clients alike; the
save completes after the sampler holds the new weights, so a client samples with the weights of
its own save or newer. Each save returns a new sampling session (a fresh namespace).

Limits: the sampler must keep its adapters in an in-process pool (the torch sampler); a vLLM
sampler refuses. With several sampler replicas behind Ray Serve a publish reaches one of them.
"""

from __future__ import annotations

import uuid
from typing import Any

from twinkle.server.gateway.routes_live_adapter import publish_live_adapter
from twinkle.server.sampler.protocol import INFLIGHT_SCHEME, decode_adapter_state, sampler_key


def inflight_uri(model_id: str) -> str:
    """The sampling session's ``model_path`` for the inflight weights of ``model_id``."""
    return f"{INFLIGHT_SCHEME}{model_id}"


def inflight_save(api: Any, owner: str, body: Any, model_id: str, run: Any):
    """What an inflight ``save_weights_for_sampler`` (``body``) runs in its turn (after every
    earlier training call of the model): publish the live adapter, then open a new sampling
    session."""
    for lookup in (api.backends.model, api.backends.sampler):
        lookup(run.base_model)  # an unknown base model is a 404 before the call is queued
    uri = inflight_uri(model_id)

    async def run_call() -> dict:
        # Tensors, not base64: in process they pass by reference, through a handle as buffers.
        await publish_live_adapter(api.backends, owner, run.base_model, model_id)
        seq = body.sampling_session_seq_id
        sid = f"{run.session_id}:sample:{seq}:{uuid.uuid4().hex[:8]}"
        api.state.create_sampling_session(
            owner,
            run.session_id,
            base_model=run.base_model,
            model_path=uri,
            sampling_session_id=sid,
        )
        return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

    return run_call


__all__ = [
    "INFLIGHT_SCHEME",
    "decode_adapter_state",
    "inflight_save",
    "inflight_uri",
    "sampler_key",
]
