"""HTTP routes of the processor application (``/api/v1/processor/...``), thin over ProcessorService."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Request

from twinkle.server.processor.service import ProcessorService
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.http import (
    DEFAULT_MAX_REQUEST_BYTES,
    Authenticator,
    install_error_handlers,
    read_json,
)
from twinkle.server.web.openapi_bodies import document_bodies, processor_bodies

router = APIRouter()
Service = Annotated[ProcessorService, bound("processor_service")]
Authenticate = Annotated[Authenticator, bound("authenticate")]
MaxBytes = Annotated[int, bound("max_request_bytes")]


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.post("/{op}")
async def call(
    op: str,
    request: Request,
    service: Service,
    authenticate: Authenticate,
    max_request_bytes: MaxBytes,
):
    owner = authenticate(request.headers)
    return {"result": await service.call(owner, op, await read_json(request, max_request_bytes))}


def create_processor_app(
    authenticate: Authenticator,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    service: ProcessorService | None = None,
) -> FastAPI:
    """``POST /<op>`` with a JSON body for every dataset operation; ``GET /healthz`` needs no key.

    Operations: ``create_dataset``, ``set_template``, ``map``, ``filter`` (declined: it needs
    code), ``encode``, ``len``, ``rows``, ``delete_dataset``; replies are ``{"result": ...}``.
    The routes are :data:`router`'s.
    """
    service = service or ProcessorService()
    app = FastAPI(title="Twinkle processor")
    install_error_handlers(app)
    document_bodies(app, processor_bodies, expand="/{op}")
    app.state.service = service
    app.include_router(
        bind_router(
            router,
            processor_service=service,
            authenticate=authenticate,
            max_request_bytes=max_request_bytes,
        )
    )
    return app
