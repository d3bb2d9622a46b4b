"""``POST /publish_live_adapter``: a tenant's live training adapter handed to its sampler, no disk.

The gateway asks the model deployment for the adapter's tensors (in the adapter's queue, so after
every earlier training call) and hands them to the sampler deployment, which holds them under the
tenant-scoped key ``inflight://<tenant>/<adapter_name>`` (the same key a Tinker inflight save of
that adapter uses). The client then samples with ``adapter_uri="inflight://<adapter_name>"``.

In one process the tensors pass by reference; between Ray Serve replicas the handle ships them
as binary buffers. ``encoding: "base64"`` sends base64 safetensors instead (the JSON form, kept
to measure against). Isolation: the model looks the adapter up under the caller's key, so
another key's adapter is a 404 and nothing is published.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends
from twinkle.server.sampler.protocol import INFLIGHT_SCHEME
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import BadRequest
from twinkle.server.web.http import read_json

_FIELDS = {"base_model", "adapter_name", "encoding"}
_ENCODINGS = ("tensors", "base64")


async def publish_live_adapter(
    backends: Backends, owner: str, base_model: str, adapter_name: str, encoding: str = "tensors"
) -> dict[str, Any]:
    """Copy ``owner``'s adapter from the model to the sampler of ``base_model``."""
    model, sampler = backends.model(base_model), backends.sampler(base_model)
    uri = f"{INFLIGHT_SCHEME}{adapter_name}"
    if encoding == "tensors":
        state = await model.call(owner, "adapter_tensors", {"adapter_name": adapter_name})
        payload = {"config": state["config"], "tensors": state["tensors"]}
    else:
        state = await model.call(owner, "tinker_adapter_state", {"adapter_name": adapter_name})
        payload = {"config": state["config"], "weights_b64": state["weights_b64"]}
    await sampler.call(owner, "publish_adapter", {"adapter_uri": uri, **payload})
    return {"adapter_uri": uri, "step": state["step"], "encoding": encoding}


def parse_publish_body(body: dict[str, Any]) -> tuple[str, str, str]:
    """(base_model, adapter_name, encoding) of a request body; a bad one is a 400 naming it."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    base_model = body.get("base_model")
    if not isinstance(base_model, str) or not base_model:
        raise BadRequest("base_model must be the served model's name, e.g. 'tiny/qwen3'")
    name = body.get("adapter_name") or "default"
    if not isinstance(name, str):
        raise BadRequest(f"adapter_name must be a string, got {type(name).__name__}")
    encoding = body.get("encoding") or "tensors"
    if encoding not in _ENCODINGS:
        raise BadRequest(f"encoding must be one of {list(_ENCODINGS)}, got {encoding!r}")
    return base_model, name, encoding


router = APIRouter()
Ctx = Annotated[ServerContext, bound("twinkle_ctx")]
Models = Annotated[Backends, bound("gateway_backends")]


@router.post("/publish_live_adapter")
async def publish(request: Request, ctx: Ctx, backends: Models) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    return await publish_live_adapter(backends, owner, *parse_publish_body(body))


def create_live_adapter_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """:data:`router` over ``ctx`` (auth, limits) and ``backends``."""
    return bind_router(router, twinkle_ctx=ctx, gateway_backends=backends)


__all__ = ["create_live_adapter_router", "parse_publish_body", "publish_live_adapter"]
