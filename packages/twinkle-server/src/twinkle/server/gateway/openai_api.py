"""The OpenAI-compatible API: ``GET /models``, ``POST /chat/completions``, ``POST /completions``.

Mounted on the gateway at ``/openai/v1`` (so ``base_url=<server>/api/v1/openai/v1``). A request's
``model`` names what samples:

* a base model, by the name it is served under (``tiny/qwen3``; its ``tiny://qwen3`` id too);
* a checkpoint, ``twinkle://<run>/<kind>/<name>`` (or ``tinker://``): the caller's own, or one
  published by another tenant; any other is a 404, as on every route;
* a live adapter, ``inflight://<adapter_name>`` (``inflight://<base_model>/<adapter_name>`` when
  the server samples several base models): what ``POST /publish_live_adapter``, the client's
  ``sampler.load_adapter_from_model`` or a Tinker inflight save handed the sampler, under the
  caller's key.

``GET /models`` lists the base models, then the caller's live adapters and checkpoints on them.

Every request goes to the base model's sampler deployment as one ``sample`` call, with the same
key, limits and queue as the native sampler. Chat messages go as a trajectory, rendered by the
sampler with the caller's template (``set_template``) or the model's default one, exactly as for
the native ``sample``. Replies stream as server-sent events once the sampler has answered.
Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from twinkle.server.config import SamplerArgs, base_model_name
from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends
from twinkle.server.gateway.openai_protocol import (
    DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    error_param,
    inline_schema,
    pick_error,
    unsupported_fields,
)
from twinkle.server.gateway.openai_responses import (
    chat_response,
    completion_response,
    stream_events,
)
from twinkle.server.process.threads import off_loop
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import ServiceError, Unauthorized, from_exception
from twinkle.server.web.http import read_json

MOUNT_PATH = "/openai/v1"
INFLIGHT = "inflight://"
_CHECKPOINT_SCHEMES = ("twinkle://", "tinker://")


class OpenAIError(Exception):
    """A refused request in OpenAI's terms: status, message, the field it is about, a code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after


def _from_service(exc: ServiceError, param: str | None = None) -> OpenAIError:
    """``exc`` in OpenAI's terms; ``param`` is the field a 400 is about. Past authentication,
    the only thing this API looks up is the model: a 404 is always about it."""
    if exc.status == 404:
        return OpenAIError(404, exc.message, "model", "model_not_found")
    code = "invalid_api_key" if isinstance(exc, Unauthorized) else None
    code = "rate_limit_exceeded" if exc.status == 429 else code
    return OpenAIError(
        exc.status, exc.message, param if exc.status == 400 else None, code, exc.retry_after
    )


@dataclass(frozen=True)
class Target:
    """What a ``model`` names: the base model's sampler and the adapter uri it samples with."""

    base_model: str
    adapter_uri: str | None


class OpenAIService:
    """Turns OpenAI requests into sampler calls and the results into OpenAI responses."""

    def __init__(self, ctx: ServerContext, backends: Backends) -> None:
        self.state, self.backends = ctx.state, backends
        self.model_ids = {
            base_model_name(app.args.model_id): app.args.model_id
            for app in ctx.config.applications
            if isinstance(app.args, SamplerArgs)
        }

    # ----------------------------------------------------------------- models
    def resolve(self, owner: str, model: str) -> Target:
        """The sampler and adapter ``model`` names for ``owner``; 404 for anything else."""
        samplers = self.backends.samplers
        if model in samplers or base_model_name(model) in samplers:
            return Target(model if model in samplers else base_model_name(model), None)
        if model.startswith(INFLIGHT):
            return self._live(model[len(INFLIGHT) :])
        if model.startswith(_CHECKPOINT_SCHEMES):
            try:
                record = self.state.resolve_checkpoint_path(owner, model, allow_public=True)
                run = self.state.get_run(record.owner, record.training_run_id)
            except ServiceError as exc:
                raise _from_service(exc, "model") from None
            if run.base_model not in samplers:
                raise OpenAIError(
                    404,
                    f"{model} was trained on {run.base_model}, which has no sampler here",
                    "model",
                    "model_not_found",
                )
            return Target(run.base_model, record.path)
        raise OpenAIError(
            404,
            f"model {model!r} does not exist here; GET /models lists the base models and your "
            "checkpoints (a live adapter is inflight://<adapter_name>)",
            "model",
            "model_not_found",
        )

    def _live(self, rest: str) -> Target:
        samplers = sorted(self.backends.samplers, key=len, reverse=True)
        base = next((b for b in samplers if rest.startswith(b + "/")), None)
        if base is not None:
            rest = rest[len(base) + 1 :]
        elif len(samplers) == 1:
            base = samplers[0]
        else:
            raise OpenAIError(
                400,
                "this server samples several base models: name the live adapter as "
                "inflight://<base_model>/<adapter_name>",
                "model",
            )
        if not rest:
            raise OpenAIError(400, "inflight:// needs an adapter name", "model")
        return Target(base, INFLIGHT + rest)

    async def list_models(self, owner: str) -> dict[str, Any]:
        """The base models with a sampler, the caller's live adapters on them, then the
        caller's checkpoints on them."""
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "twinkle"}
            for name in self.backends.samplers
        ]
        for uri, base in await self.live_adapters(owner):
            data.append(self._checkpoint_model(uri, 0, base))
        runs, _ = self.state.list_runs(owner, limit=1000)
        for run in runs:
            if run.base_model not in self.backends.samplers:
                continue
            for ckpt in self.state.list_checkpoints(owner, run.training_run_id):
                if not ckpt.ephemeral:
                    data.append(self._checkpoint_model(ckpt.path, ckpt.time, run.base_model))
        return {"object": "list", "data": data}

    async def live_adapters(self, owner: str) -> list[tuple[str, str]]:
        """``(model id, base model)`` of the caller's live adapters on every sampler; named
        ``inflight://<base_model>/<name>`` when the server samples several base models."""
        several = len(self.backends.samplers) > 1
        found = []
        for base, sampler in self.backends.samplers.items():
            try:
                uris = (await sampler.call(owner, "live_adapters", {}))["adapter_uris"]
            except ServiceError as exc:
                if exc.status != 404:  # a sampler without the operation holds none to list
                    raise
                continue
            for uri in uris:
                found.append((f"{INFLIGHT}{base}/{uri[len(INFLIGHT) :]}" if several else uri, base))
        return found

    def get_model(self, owner: str, model: str) -> dict[str, Any]:
        target = self.resolve(owner, model)
        if target.adapter_uri is None:
            return {"id": target.base_model, "object": "model", "created": 0, "owned_by": "twinkle"}
        return self._checkpoint_model(model, 0, target.base_model)

    @staticmethod
    def _checkpoint_model(path: str, created: float, base: str) -> dict[str, Any]:
        return {
            "id": path,
            "object": "model",
            "created": int(created),
            "owned_by": "you",
            "parent": base,
            "root": base,
        }

    # --------------------------------------------------------------- sampling
    def params(self, req: ChatCompletionRequest | CompletionRequest, base: str) -> dict[str, Any]:
        """The sampler's ``sampling_params`` for ``req``, within the sampler's limits."""
        for name, why in unsupported_fields(req):
            raise OpenAIError(400, f"{name} {why}", name)
        chat = isinstance(req, ChatCompletionRequest)
        max_tokens = (req.max_completion_tokens if chat else None) or req.max_tokens
        limits = self.backends.sample_limits.get(base)
        if limits is not None:
            for name, value, most in (
                ("n", req.n, limits.max_num_samples),
                ("max_tokens", max_tokens, limits.max_sample_tokens),
            ):
                if value is not None and value > most:
                    raise OpenAIError(
                        400, f"{name} is {value}; this model allows at most {most}", name
                    )
        params: dict[str, Any] = {
            "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
            "num_samples": req.n,
            "stop": req.stop_strings(),
            "seed": req.seed,
            "logprobs": True,
        }
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            if getattr(req, name) is not None:
                params[name] = getattr(req, name)
        topk = (req.top_logprobs if chat else req.logprobs) or 0
        if topk:
            params["topk_logprobs"] = topk
        return params

    async def sample(
        self, owner: str, target: Target, inputs: list[Any], params: dict[str, Any], param: str
    ) -> list[dict[str, Any]]:
        """The sampler's results for ``inputs``; its refusals in OpenAI's terms (``param``: the
        field a 400 is about)."""
        payload = {"inputs": inputs, "adapter_uri": target.adapter_uri, "sampling_params": params}
        try:
            response = await self.backends.sampler(target.base_model).call(owner, "sample", payload)
        except ServiceError as exc:
            raise _from_service(exc, param) from None
        return response["results"]

    async def tokenizer(self, base: str) -> Any:
        from twinkle.hub import load_tokenizer

        return await off_loop(load_tokenizer, self.model_ids.get(base, base))


# --------------------------------------------------------------------- routes
async def _body(request: Request, model: type, ctx: ServerContext):
    try:
        raw = await read_json(request, ctx.server_args.max_request_bytes)
    except ServiceError as exc:
        raise _from_service(exc) from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError, prefix: tuple[str, ...] = ()) -> OpenAIError:
    error = pick_error(exc.errors(include_url=False))
    param = error_param((*prefix, *error["loc"]))
    given = error.get("input")
    got = f" (got {given!r})" if isinstance(given, (str, int, float)) else ""
    return OpenAIError(400, f"{param or 'body'}: {error['msg']}{got}", param)


async def chat_completions(service: OpenAIService, owner: str, req: ChatCompletionRequest):
    target = service.resolve(owner, req.model)
    params = service.params(req, target.base_model)
    trajectory = {"messages": [m.to_twinkle() for m in req.messages]}
    try:
        from twinkle_client.data_format import Trajectory

        Trajectory.model_validate(trajectory)
    except ValidationError as exc:
        raise _invalid(exc) from None
    results = await service.sample(owner, target, [trajectory], params, "messages")
    tokenizer = await service.tokenizer(target.base_model) if req.logprobs else None
    return _reply(chat_response(req, results, tokenizer), req)


async def completions(service: OpenAIService, owner: str, req: CompletionRequest):
    target = service.resolve(owner, req.model)
    params = service.params(req, target.base_model)
    prompt = req.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt is empty", "prompt")
    wants_text = req.echo or req.logprobs is not None or any(isinstance(p, str) for p in prompt)
    tokenizer = await service.tokenizer(target.base_model) if wants_text else None
    inputs = [p if isinstance(p, list) else tokenizer.encode(p) for p in prompt]
    texts = (
        [p if isinstance(p, str) else tokenizer.decode(p) for p in prompt]
        if req.echo
        else [""] * len(prompt)
    )
    results = await service.sample(owner, target, inputs, params, "prompt")
    return _reply(completion_response(req, results, texts, tokenizer), req)


def _reply(response: dict[str, Any], req: ChatCompletionRequest | CompletionRequest):
    if not req.stream:
        return response
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return StreamingResponse(
        stream_events(response, usage),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _now(fn, *args: Any) -> Any:
    return fn(*args)


async def _guarded(call) -> Any:
    """``await call()``; every failure as OpenAI's error JSON (the gateway's own handlers would
    answer in Twinkle's shape)."""
    try:
        return await call()
    except OpenAIError as exc:
        return _error_response(exc)
    except ServiceError as exc:
        return _error_response(_from_service(exc))
    except Exception as exc:  # noqa: BLE001 - logged with a request id by from_exception
        return _error_response(_from_service(from_exception(exc)))


def _error_response(exc: OpenAIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if exc.retry_after:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return JSONResponse(
        error_body(exc.status, exc.message, exc.param, exc.code), exc.status, headers=headers
    )


def _json_body(model: type) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as the JSON request body (the route reads the
    body itself, to answer a bad one in OpenAI's error shape)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(model)}},
        }
    }


router = APIRouter(prefix=MOUNT_PATH, tags=["openai"])
Ctx = Annotated[ServerContext, bound("twinkle_ctx")]
Service = Annotated[OpenAIService, bound("openai_service")]


def _owner_of(ctx: ServerContext, request: Request) -> str:
    try:
        return ctx.authenticate(request.headers)
    except ServiceError as exc:
        raise _from_service(exc) from None


@router.get("/models")
async def list_models(request: Request, ctx: Ctx, service: Service):
    return await _guarded(lambda: service.list_models(_owner_of(ctx, request)))


@router.get("/models/{model:path}")
async def get_model(model: str, request: Request, ctx: Ctx, service: Service):
    return await _guarded(lambda: _now(service.get_model, _owner_of(ctx, request), model))


@router.post("/chat/completions", openapi_extra=_json_body(ChatCompletionRequest))
async def chat(request: Request, ctx: Ctx, service: Service):
    async def run():
        owner = _owner_of(ctx, request)
        req = await _body(request, ChatCompletionRequest, ctx)
        return await chat_completions(service, owner, req)

    return await _guarded(run)


@router.post("/completions", openapi_extra=_json_body(CompletionRequest))
async def complete(request: Request, ctx: Ctx, service: Service):
    async def run():
        owner = _owner_of(ctx, request)
        return await completions(service, owner, await _body(request, CompletionRequest, ctx))

    return await _guarded(run)


def create_openai_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """The API's routes under :data:`MOUNT_PATH` (:data:`router`, over an
    :class:`OpenAIService` of ``ctx`` and ``backends``); every answer of theirs, errors
    included, is in OpenAI's shape."""
    return bind_router(router, twinkle_ctx=ctx, openai_service=OpenAIService(ctx, backends))


__all__ = ["MOUNT_PATH", "OpenAIService", "create_openai_router"]
