"""HTTP routes of the model deployment (``/api/v1/model/<org>/<name>/...``), thin over ModelService."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from twinkle.server.model.service import ModelService
from twinkle.server.web import (
    DEFAULT_MAX_REQUEST_BYTES,
    Authenticator,
    install_error_handlers,
    read_json,
)


def create_model_app(
    service: ModelService,
    authenticate: Authenticator,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """A FastAPI app exposing every model operation as ``POST /<op>`` with a JSON body.

    The body holds the method's keyword arguments plus ``adapter_name``; the reply is the
    method's result as JSON. ``GET /healthz`` needs no key.
    """
    app = FastAPI(title=f"Twinkle model {service.base_model}")
    install_error_handlers(app)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "base_model": service.base_model}

    @app.get("/status")
    async def status(request: Request) -> dict:
        return service.status(authenticate(request.headers))

    @app.post("/{op}")
    async def call(op: str, request: Request):
        owner = authenticate(request.headers)
        payload = await read_json(request, max_request_bytes)
        # Results are plain JSON values already (``ops.jsonable``): no re-encoding pass.
        return JSONResponse({"result": await service.call(owner, op, payload)})

    return app
