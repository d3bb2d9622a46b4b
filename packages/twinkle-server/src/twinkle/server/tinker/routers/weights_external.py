"""Tinker routes for weights beyond the core loop: copies, external (PEFT) exports and their
signed download URLs, checkpoint archives, joining a sampling session."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask
from tinker import types

from twinkle.server.tinker import weights_external as service
from twinkle.server.tinker.routers._deps import Api, IdemKey, Owner, sdk_body
from twinkle.server.tinker.weights_external import ARCHIVES, DOWNLOAD

router = APIRouter()
CHECKPOINT = "/training_runs/{run_id}/checkpoints/{kind}/{name}"


def _api_url(request: Request) -> str:
    """The API's base URL as the client reached it (download URLs are built under it)."""
    return str(request.url).split("/training_runs/", 1)[0]


@router.post("/copy_weights")
async def copy_weights(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.CopyWeightsRequest, sdk_body("copy_weights")],
) -> dict:
    return service.copy_weights(api, owner, body, idem)


@router.post("/save_weights_external")
async def save_weights_external(
    api: Api,
    owner: Owner,
    idem: IdemKey,
    body: Annotated[types.SaveWeightsExternalRequest, sdk_body("save_weights_external")],
) -> dict:
    return await service.save_weights_external(api, owner, body, idem)


@router.get(f"{CHECKPOINT}/external_weights_urls")
async def external_weights_urls(
    run_id: str, kind: str, name: str, request: Request, api: Api, owner: Owner
) -> dict:
    return service.external_weights_urls(api, owner, run_id, kind, name, _api_url(request))


@router.get(f"/{DOWNLOAD}/{{owner}}/{{run_id}}/{{name}}/{{rel:path}}")
async def download(
    owner: str, run_id: str, name: str, rel: str, api: Api, expires: str = "", signature: str = ""
) -> FileResponse:
    """No API key: the URL's signature is the credential."""
    path = service.external_file(api, owner, run_id, name, rel, expires, signature)
    return FileResponse(path, media_type="application/octet-stream")


@router.get(f"{CHECKPOINT}/archive")
async def checkpoint_archive_url(
    run_id: str, kind: str, name: str, request: Request, api: Api, owner: Owner
) -> dict:
    return service.archive_url(api, owner, run_id, kind, name, _api_url(request))


@router.get(f"/{ARCHIVES}/{{owner}}/{{run_id}}/{{kind}}/{{archive}}")
async def download_archive(
    owner: str,
    run_id: str,
    kind: str,
    archive: str,
    api: Api,
    expires: str = "",
    signature: str = "",
) -> FileResponse:
    """No API key: the URL's signature is the credential."""
    name = archive.removesuffix(".tar.gz")
    packed = await service.packed_archive(api, owner, run_id, kind, name, expires, signature)
    return FileResponse(
        packed,
        media_type="application/gzip",
        filename=f"{run_id}-{name}.tar.gz",
        background=BackgroundTask(os.unlink, packed),
    )


@router.post("/join_sampling_session")
async def join_sampling_session(
    api: Api,
    owner: Owner,
    body: Annotated[types.JoinSamplingSessionRequest, sdk_body("join_sampling_session")],
) -> dict:
    return service.join_sampling_session(api, owner, body)
