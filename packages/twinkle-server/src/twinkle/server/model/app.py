"""HTTP routes of the model deployment (``/api/v1/model/<org>/<name>/...``), thin over ModelService."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from twinkle.server.model.service import ModelService
from twinkle.server.web.auth import caller_key
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import NotFound
from twinkle.server.web.http import (
    DEFAULT_MAX_REQUEST_BYTES,
    Authenticator,
    install_error_handlers,
    read_json,
)
from twinkle.server.web.openapi_bodies import document_bodies, model_bodies

router = APIRouter()
Service = Annotated[ModelService, bound("model_service")]
Authenticate = Annotated[Authenticator, bound("authenticate")]
MaxBytes = Annotated[int, bound("max_request_bytes")]
DirectUrl = Annotated[Callable[[], Awaitable[str | None]] | None, bound("direct_url")]
Signer = Annotated[Any, bound("signer")]


@router.get("/healthz")
async def healthz(service: Service) -> dict:
    return {"status": "ok", "base_model": service.base_model}


@router.get("/endpoint")
async def endpoint(request: Request, authenticate: Authenticate, direct_url: DirectUrl) -> dict:
    authenticate(request.headers)
    return {"direct_url": await direct_url() if direct_url is not None else None}


@router.get("/status")
async def status(request: Request, service: Service, authenticate: Authenticate) -> dict:
    return service.status(authenticate(request.headers))


@router.post("/{op}")
async def call(
    op: str,
    request: Request,
    service: Service,
    authenticate: Authenticate,
    max_request_bytes: MaxBytes,
    signer: Signer,
):
    owner = authenticate(request.headers)
    if op in service.operations and service.operations.get(op).internal:
        raise NotFound(f"operation {op!r} is served to other deployments only, not over HTTP")
    payload = await read_json(request, max_request_bytes)
    # Results are plain JSON values already (``ops.jsonable``): no re-encoding pass.
    key = caller_key(request.headers, signer)
    return JSONResponse({"result": await service.call(owner, op, payload, key)})


def create_model_app(
    service: ModelService,
    authenticate: Authenticator,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    direct_url: Callable[[], Awaitable[str | None]] | None = None,
    signer: Any = None,
) -> FastAPI:
    """A FastAPI app exposing every model operation as ``POST /<op>`` with a JSON body.

    The body holds the method's keyword arguments plus ``adapter_name``; the reply is the
    method's result as JSON. ``GET /healthz`` needs no key. ``GET /endpoint`` tells a client
    where this model answers without the Serve proxy: ``{"direct_url": "http://host:port"}``
    (same paths, same keys), or ``null`` when it does not (``direct_url`` returns the address).
    ``signer`` (the server's :class:`~twinkle.server.web.signing.Signer`) reads the API key sealed in
    a presented token, for operations that use the caller's key. The routes are :data:`router`'s.
    """
    app = FastAPI(title=f"Twinkle model {service.base_model}")
    install_error_handlers(app)
    document_bodies(app, model_bodies(service.operations), expand="/{op}")
    app.include_router(
        bind_router(
            router,
            model_service=service,
            authenticate=authenticate,
            max_request_bytes=max_request_bytes,
            direct_url=direct_url,
            signer=signer,
        )
    )
    return app
