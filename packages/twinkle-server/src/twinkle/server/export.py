"""Merged-model export: a tenant's checkpoint merged into its base model, downloaded or published.

Routes of the gateway (``/api/v1``). Each needs the API key except the file download, and only
the checkpoint's owner gets anything: another key's checkpoint, published or not, is a 404.

- ``POST /merged_exports`` ``{"twinkle_path", "max_shard_size"?}``: start the merge (or join the
  one already made or under way) and answer its status.
- ``GET /merged_exports/{export_id}``: the status: ``building``, ``failed`` (with ``error``) or
  ``ready``, with ``files`` (name -> signed download URL), ``size_bytes`` and ``expires``.
- ``GET /merged_export_files/{export_id}/{file}?expires=...&signature=...``: one file. The URL's
  signature (the server's HMAC, as for checkpoint archives) is the credential; an altered or
  expired one is a 403.
- ``POST /merged_exports/publish`` ``{"twinkle_path", "repo_id", "hub": "hf"|"ms", "token"?,
  "private"?, "commit_message"?, "max_shard_size"?}``: merge (or reuse the merge), then upload
  the directory in the background; ``GET /merged_exports/publish/{publish_id}`` answers
  ``building``, ``uploading``, ``uploaded`` (with ``url`` and ``files``) or ``failed``.
  ``hf`` needs the caller's Hugging Face token; ``ms`` follows the ModelScope token rule of
  :mod:`twinkle.server.hub`. A token is used for that upload only and never stored.

A merge runs on a thread of its own (one at a time per gateway replica; the others queue), off the
event loop, through :func:`twinkle.model.export.merge_adapter`. Its result is kept under
``<storage>/merged_exports/<export_id>/``, one per checkpoint save (a checkpoint saved again
under its name is a new export), for ``TWINKLE_EXPORT_KEEP_S`` seconds (default a day). Guards:
a base model whose weights exceed ``TWINKLE_EXPORT_MAX_BYTES`` (default 200 GB) or the free disk
is refused, and a merge still unfinished ``TWINKLE_EXPORT_TIMEOUT_S`` seconds (default an hour)
after it was asked for is reported failed and its output discarded.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from twinkle.errors import TwinkleError
from twinkle.server.context import ServerContext
from twinkle.server.env import (
    TWINKLE_EXPORT_KEEP_S,
    TWINKLE_EXPORT_MAX_BYTES,
    TWINKLE_EXPORT_TIMEOUT_S,
    EnvVar,
)
from twinkle.server.hub import HubPublisher, HubToken, check_hf_token, upload_folder_to_hf
from twinkle.server.process.threads import off_loop
from twinkle.server.web.auth import caller_key
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.errors import BadRequest, Forbidden, NotFound, ServiceError
from twinkle.server.web.http import read_json

logger = logging.getLogger("twinkle.server.export")

URL_TTL_S = 3600.0
DEFAULT_MAX_SHARD_SIZE = "5GB"
MIN_SHARD_BYTES = 64 * 1024
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)?", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")
_EXPORT_FIELDS = {"twinkle_path", "max_shard_size"}
_PUBLISH_FIELDS = _EXPORT_FIELDS | {"repo_id", "hub", "token", "private", "commit_message"}
_FILES = "merged_export_files"


def _env_float(variable: EnvVar[float]) -> float:
    try:
        return variable.get()
    except ValueError:
        return variable.default


def parse_shard_size(value: Any) -> int:
    """``max_shard_size`` in bytes: a positive integer or ``"5GB"``, ``"500MB"``, ``"2GiB"``.

    Raises:
        BadRequest: Anything else, or under 64 KiB (the message names the field).
    """
    value = DEFAULT_MAX_SHARD_SIZE if value is None else value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif match:
        size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    else:
        raise BadRequest(f"max_shard_size must be bytes or like '5GB', got {value!r}")
    if size < MIN_SHARD_BYTES:
        raise BadRequest(f"max_shard_size must be at least {MIN_SHARD_BYTES} bytes, got {value!r}")
    return size


class ExportService:
    """Merges, their status (in the shared store, so every gateway replica answers) and
    publishes. Plain Python: the routes below are its only web layer."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.store = ctx.state.store
        self.root = ctx.storage_root / "merged_exports"
        self.max_bytes = _env_float(TWINKLE_EXPORT_MAX_BYTES)
        self.timeout_s = _env_float(TWINKLE_EXPORT_TIMEOUT_S)
        self.keep_s = _env_float(TWINKLE_EXPORT_KEEP_S)
        self.hub = HubPublisher.from_config(ctx.config.hub)
        self._builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinkle-export")
        self._uploads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="twinkle-export-up")

    # ------------------------------------------------------------------ merge
    def start(self, owner: str, twinkle_path: Any, max_shard_size: Any = None) -> dict[str, Any]:
        """Start (or join) the merge of ``owner``'s checkpoint; its status record."""
        if not isinstance(twinkle_path, str) or not twinkle_path:
            raise BadRequest("twinkle_path must be the checkpoint's twinkle:// path")
        shard = parse_shard_size(max_shard_size)
        record = self.ctx.state.resolve_checkpoint_path(owner, twinkle_path, allow_public=False)
        from twinkle.model.export import read_adapter_config

        read_adapter_config(record.local_dir)  # a checkpoint that cannot merge: a 4xx now
        run = self.ctx.state.get_run(owner, record.training_run_id)
        seed = f"{owner}\n{record.path}\n{record.time!r}\n{shard}"
        export_id = hashlib.sha256(seed.encode()).hexdigest()[:24]
        claim = uuid.uuid4().hex
        now = self.ctx.state.clock()

        def claim_if_free(current: dict | None) -> dict:
            if current and current["status"] == "ready" and (self.root / export_id).is_dir():
                return current
            if current and current["status"] == "building" and not self._overdue(current, now):
                return current
            return {
                "export_id": export_id,
                "owner": owner,
                "twinkle_path": record.path,
                "status": "building",
                "started_at": now,
                "claim": claim,
            }

        status = self.store.update(self._key(export_id), claim_if_free)
        if status.get("claim") == claim:
            self._sweep(now)
            model_id = self._model_id(run.base_model)
            self._builds.submit(self._build, export_id, record.local_dir, model_id, shard)
        return status

    def status(self, owner: str, export_id: str) -> dict[str, Any]:
        """The status record of one of ``owner``'s merges (another key's is a 404)."""
        status = self.store.get(self._key(export_id))
        if status is None or status.get("owner") != owner:
            raise NotFound(f"no merged export {export_id!r} of this API key")
        if status["status"] == "building" and self._overdue(status, self.ctx.state.clock()):
            return {**status, "status": "failed", "error": self._timeout_message()}
        return status

    def _build(self, export_id: str, adapter_dir: str, model_id: str, shard: int) -> None:
        from twinkle.hub import resolve_model_dir
        from twinkle.model.export import base_model_size, merge_adapter

        key, out = self._key(export_id), self.root / export_id
        started = self.store.get(key)["started_at"]
        try:
            model_dir = resolve_model_dir(model_id)
            need = base_model_size(model_dir)
            if need > self.max_bytes:
                raise BadRequest(
                    f"the base model's weights take {need} bytes, over this server's export "
                    f"limit of {int(self.max_bytes)} bytes (TWINKLE_EXPORT_MAX_BYTES)"
                )
            self.root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.root).free
            if free < need * 1.1:
                raise BadRequest(f"not enough free disk to merge: {need} bytes needed, {free} free")
            merged = merge_adapter(model_dir, adapter_dir, out, shard, overwrite=True)
            if self.ctx.state.clock() - started > self.timeout_s:
                shutil.rmtree(out, ignore_errors=True)
                raise BadRequest(self._timeout_message())
            done = {"files": list(merged.files), "size_bytes": merged.size_bytes}
            self._finish(key, {"status": "ready", "finished_at": self.ctx.state.clock(), **done})
            logger.info("merged export %s: %d bytes", export_id, merged.size_bytes)
        except Exception as exc:  # noqa: BLE001 - reported in the status
            self._finish(key, {"status": "failed", "error": _reason(exc)})

    def _finish(self, key: str, fields: dict[str, Any]) -> None:
        self.store.update(key, lambda current: {**(current or {}), **fields})

    def file(self, export_id: str, name: str, expires: str, signature: str) -> Path:
        """The file behind a signed download URL.

        Raises:
            Forbidden: The signature is not ours or has expired.
            NotFound: The export or the file is gone.
        """
        self._verify(f"{export_id}/{name}", expires, signature)
        status = self.store.get(self._key(export_id))
        root = (self.root / export_id).resolve()
        path = (root / name).resolve()
        if status is None or status.get("status") != "ready" or name not in status["files"]:
            raise NotFound(f"{name} is not a file of merged export {export_id}")
        if not path.is_relative_to(root) or not path.is_file():
            raise NotFound(f"{name} is not a file of merged export {export_id}")
        return path

    def with_urls(self, status: dict[str, Any], base_url: str) -> dict[str, Any]:
        """``status`` as the wire answer: no claim, and signed file URLs once ready."""
        wire = {k: v for k, v in status.items() if k not in ("claim", "owner")}
        if status["status"] != "ready":
            return wire
        expires, export_id = int(self.ctx.state.clock() + URL_TTL_S), status["export_id"]
        wire["files"] = {
            name: f"{base_url}/{_FILES}/{export_id}/{quote(name)}"
            f"?expires={expires}&signature={self._sign(f'{export_id}/{name}', expires)}"
            for name in status["files"]
        }
        wire["expires"] = datetime.fromtimestamp(expires, timezone.utc).isoformat()
        return wire

    # ------------------------------------------------------------------ publish
    def publish(self, owner: str, body: dict[str, Any], presented: str | None) -> dict[str, Any]:
        """Check what can be checked now (body, token, hub), then merge and upload in the
        background; the publish's status record."""
        hub, repo_id = body.get("hub") or "hf", body.get("repo_id")
        if hub not in ("hf", "ms"):
            raise BadRequest(f"hub must be 'hf' (Hugging Face) or 'ms' (ModelScope), got {hub!r}")
        if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id):
            raise BadRequest(f"repo_id must be 'owner/name', got {repo_id!r}")
        private = body.get("private")
        if not isinstance(private, (bool, type(None))):
            raise BadRequest("private must be true, false or null")
        message = body.get("commit_message")
        if not isinstance(message, (str, type(None))):
            raise BadRequest("commit_message must be a string")
        token = body.get("token")
        if not isinstance(token, (str, type(None))):
            raise BadRequest("token must be a string")
        parse_shard_size(body.get("max_shard_size"))
        path = body.get("twinkle_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("twinkle_path must be the checkpoint's twinkle:// path")
        # Another key's checkpoint is a 404 before the hub hears anything.
        self.ctx.state.resolve_checkpoint_path(owner, path, allow_public=False)
        if hub == "hf":
            check_hf_token(token)
            upload_token = HubToken(token.strip(), "request")
        elif token:
            self.hub.check_reachable()
            upload_token = HubToken(token.strip(), "request")
        else:
            upload_token = self.hub.token_for(presented)
        export = self.start(owner, path, body.get("max_shard_size"))
        publish_id = uuid.uuid4().hex[:24]
        status = {
            "publish_id": publish_id,
            "owner": owner,
            "export_id": export["export_id"],
            "hub": hub,
            "repo_id": repo_id,
            "status": "building",
            "token": upload_token.source,
        }
        self.store.put(self._publish_key(publish_id), status)
        private = self.hub.private if private is None else private
        self._uploads.submit(self._upload, status, upload_token, private, message)
        return status

    def publish_status(self, owner: str, publish_id: str) -> dict[str, Any]:
        status = self.store.get(self._publish_key(publish_id))
        if status is None or status.get("owner") != owner:
            raise NotFound(f"no merged publish {publish_id!r} of this API key")
        return {k: v for k, v in status.items() if k != "owner"}

    def _upload(self, status: dict, token: HubToken, private: bool, message: str | None) -> None:
        key = self._publish_key(status["publish_id"])
        try:
            export = self._wait_built(status["owner"], status["export_id"])
            self.store.update(key, lambda current: {**current, "status": "uploading"})
            directory = self.root / export["export_id"]
            if status["hub"] == "hf":
                done = upload_folder_to_hf(
                    directory, status["repo_id"], token.token, private=private,
                    commit_message=message,
                )  # fmt: skip
            else:
                done = self._upload_ms(directory, status["repo_id"], token, private, message)
            fields = {"status": "uploaded", "url": done["url"], "files": done["files"]}
            logger.info("published merged export %s to %s", export["export_id"], done["url"])
        except Exception as exc:  # noqa: BLE001 - reported in the status
            fields = {"status": "failed", "error": _reason(exc)}
        self.store.update(key, lambda current: {**current, **fields})

    def _wait_built(self, owner: str, export_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            export = self.status(owner, export_id)
            if export["status"] == "ready":
                return export
            if export["status"] == "failed":
                raise BadRequest(f"the merge failed: {export.get('error')}")
            time.sleep(0.2)
        raise BadRequest(self._timeout_message())

    def _upload_ms(
        self, directory: Path, repo_id: str, token: HubToken, private: bool, message: str | None
    ) -> dict[str, Any]:
        try:
            from modelscope.hub.api import HubApi
        except ImportError:
            raise BadRequest("publishing to ModelScope needs modelscope on the server") from None
        api = HubApi(endpoint=self.hub.address(), token=token.token)
        with self.hub.hub_errors():
            api.create_repo(repo_id, visibility="private" if private else "public", exist_ok=True)
            api.upload_folder(
                repo_id=repo_id,
                folder_path=str(directory),
                commit_message=message or f"Upload {repo_id} from Twinkle",
                use_cache=False,
                disable_tqdm=True,
            )
        files = sorted(p.name for p in directory.iterdir() if p.is_file())
        return {"url": f"{api.endpoint}/models/{repo_id}", "files": files}

    # ------------------------------------------------------------------ helpers
    def _model_id(self, base_model: str) -> str:
        """The configured model id (``tiny://...``, ``hf://...``) of a served base model name."""
        from twinkle.server.config.args import base_model_name

        for app in self.ctx.config.applications:
            model_id = getattr(app.args, "model_id", None)
            if model_id and base_model_name(model_id) == base_model:
                return model_id
        return base_model

    def _sweep(self, now: float) -> None:
        """Drop merges kept longer than ``keep_s`` (one listing of the export root)."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            status = self.store.get(self._key(path.name)) or {}
            finished = status.get("finished_at")
            if finished is not None and now - finished > self.keep_s:
                shutil.rmtree(path, ignore_errors=True)
                self.store.delete(self._key(path.name))

    def _overdue(self, status: dict, now: float) -> bool:
        return now - status.get("started_at", now) > self.timeout_s

    def _timeout_message(self) -> str:
        return (
            f"the merge did not finish within {self.timeout_s:g} s (TWINKLE_EXPORT_TIMEOUT_S); "
            "its output is discarded"
        )

    def _sign(self, path: str, expires: int) -> str:
        return self.ctx.signer.mac(f"merged:{path}\n{expires}")

    def _verify(self, path: str, expires: str, signature: str) -> None:
        try:
            when = int(expires)
        except ValueError:
            raise Forbidden("malformed download URL") from None
        if not self.ctx.signer.check(f"merged:{path}\n{when}", signature or ""):
            raise Forbidden("invalid download URL signature")
        if when <= self.ctx.state.clock():
            raise Forbidden("download URL expired")

    @staticmethod
    def _key(export_id: str) -> str:
        return f"export/merged/{export_id}"

    @staticmethod
    def _publish_key(publish_id: str) -> str:
        return f"export/publish/{publish_id}"


def _reason(exc: BaseException) -> str:
    """What a tenant reads of a failed merge or upload: the message of a mistake it can fix,
    else the kind of failure (the details go to the server log)."""
    if isinstance(exc, (ServiceError, TwinkleError, ValueError, FileNotFoundError)):
        return str(exc)
    logger.error("merged export failed", exc_info=exc)
    return f"internal error ({type(exc).__name__}); see the server log"


def _check_fields(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; known: {sorted(known)}")


router = APIRouter()
Ctx = Annotated[ServerContext, bound("twinkle_ctx")]
Exports = Annotated[ExportService, bound("export_service")]


def _base_url(request: Request) -> str:
    return str(request.url).split("/merged_exports", 1)[0]


@router.post("/merged_exports")
async def start(request: Request, ctx: Ctx, service: Exports) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    _check_fields(body, _EXPORT_FIELDS)
    status = await off_loop(
        service.start, owner, body.get("twinkle_path"), body.get("max_shard_size")
    )
    return service.with_urls(status, _base_url(request))


@router.get("/merged_exports/{export_id}")
async def status(export_id: str, request: Request, ctx: Ctx, service: Exports) -> dict:
    owner = ctx.authenticate(request.headers)
    return service.with_urls(service.status(owner, export_id), _base_url(request))


@router.get(f"/{_FILES}/{{export_id}}/{{name}}")
async def download(
    export_id: str, name: str, service: Exports, expires: str = "", signature: str = ""
):
    """No API key: the URL's signature is the credential."""
    path = service.file(export_id, name, expires, signature)
    return FileResponse(path, media_type="application/octet-stream", filename=name)


@router.post("/merged_exports/publish")
async def publish(request: Request, ctx: Ctx, service: Exports) -> dict:
    owner = ctx.authenticate(request.headers)
    body = await read_json(request, ctx.server_args.max_request_bytes)
    _check_fields(body, _PUBLISH_FIELDS)
    presented = caller_key(request.headers, ctx.signer)
    status = await off_loop(service.publish, owner, body, presented)
    return {k: v for k, v in status.items() if k != "owner"}


@router.get("/merged_exports/publish/{publish_id}")
async def publish_status(publish_id: str, request: Request, ctx: Ctx, service: Exports) -> dict:
    owner = ctx.authenticate(request.headers)
    return service.publish_status(owner, publish_id)


def create_export_router(ctx: ServerContext) -> APIRouter:
    """:data:`router` over ``ctx`` and an :class:`ExportService` of its own."""
    service = ExportService(ctx)
    bound_router = bind_router(router, twinkle_ctx=ctx, export_service=service)
    bound_router.export_service = service  # type: ignore[attr-defined] - for tests and the console
    return bound_router


__all__ = ["ExportService", "create_export_router", "parse_shard_size"]
