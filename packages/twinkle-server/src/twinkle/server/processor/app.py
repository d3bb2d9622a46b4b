"""HTTP routes of the processor application (``/api/v1/processor/...``), thin over ProcessorService."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from twinkle.server.processor.service import ProcessorService
from twinkle.server.web.http import (
    DEFAULT_MAX_REQUEST_BYTES,
    Authenticator,
    install_error_handlers,
)
from twinkle.server.web.openapi_bodies import document_bodies, processor_bodies
from twinkle.server.web.operations import operation_routes

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


def create_processor_app(
    authenticate: Authenticator,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    service: ProcessorService | None = None,
) -> FastAPI:
    """``POST /<op>`` with a JSON body for every dataset operation; ``GET /healthz`` needs no key.

    Operations: ``create_dataset``, ``set_template``, ``map``, ``filter`` (declined: it needs
    code), ``encode``, ``len``, ``rows``, ``delete_dataset``; replies are ``{"result": ...}``.
    ``/healthz`` is :data:`router`'s, ``/<op>`` comes from
    :func:`twinkle.server.web.operations.operation_routes`.
    """
    service = service or ProcessorService()
    app = FastAPI(title="Twinkle processor")
    install_error_handlers(app)
    document_bodies(app, processor_bodies, expand="/{op}")
    app.state.service = service
    app.include_router(router)
    app.include_router(operation_routes(service, authenticate, max_request_bytes))
    return app
