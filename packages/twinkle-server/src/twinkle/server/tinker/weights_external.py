"""Tinker weights beyond the core loop: ``copy_weights``, ``save_weights_external`` and
its signed download URLs, ``join_sampling_session``.

- ``copy_weights`` (``ServiceClient.copy_weights`` / ``RestClient.copy_weights``, sync): the
  source checkpoint into a new training run of the caller (a new session, or the request's
  ``session_id``/``model_seq_id``), same kind and name; files are hard links (no bytes
  duplicated; a copy when the file system refuses links). The new run has no adapter loaded, so it
  cannot be trained on. Retries with the same ``X-Idempotency-Key`` answer the first copy.
- ``save_weights_external`` (future): ``external_weights/<name>`` in PEFT layout, optionally
  age-encrypted (see :mod:`twinkle.server.model.tinker_weights_ops`).
- ``GET training_runs/{id}/checkpoints/external_weights/{name}/external_weights_urls``: one URL per
  file, signed with HMAC-SHA256 over ``path + expiry`` under a server secret kept in the shared
  state (every gateway replica verifies every URL). The download route needs no API key and
  refuses expired or altered URLs with 403; only the checkpoint's owner can mint URLs.
- ``GET training_runs/{id}/checkpoints/{kind}/{name}/archive`` (``get_checkpoint_archive_url`` of
  the SDKs before 0.38, which 0.38 dropped): a signed URL, as above, of a ``.tar.gz`` of the
  checkpoint's regular files, built when it is downloaded.
- ``join_sampling_session``: a new, unique ``client_counter`` (from 1; the original client is 0)
  for a client rebuilt from a sampler handle (``SamplingClient.from_sampler_handle``).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from tinker import types

from twinkle.server.model.tinker_weights_ops import EXTERNAL_KIND, age_recipients
from twinkle.server.process.threads import off_loop
from twinkle.server.state import checkpoint_dir
from twinkle.server.state.paths import (
    MAX_CHECKPOINT_TTL_S,
    parse_checkpoint_path,
    validate_checkpoint_name,
)
from twinkle.server.tinker import convert
from twinkle.server.tinker.api import TinkerApi
from twinkle.server.web.errors import BadRequest, Forbidden, NotFound
from twinkle.server.web.signing import Signer

URL_TTL_S = 3600.0
MIN_TTL_S, MAX_TTL_S = 3600, MAX_CHECKPOINT_TTL_S  # the longest any checkpoint may have
DOWNLOAD = "external_weights_files"  # the download routes' first path segment
ARCHIVES = "checkpoint_archives"
MAX_RECIPIENTS = 10


class UrlSigner:
    """Signatures (the server :class:`Signer`'s MAC) over ``<path>\\n<expires>``."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    def sign(self, path: str, expires: int) -> str:
        return self.signer.mac(f"{path}\n{expires}")

    def verify(self, path: str, expires: str, signature: str, now: float) -> None:
        """Raise :class:`Forbidden` unless ``signature`` is ours for ``path`` and not expired."""
        try:
            when = int(expires)
        except ValueError:
            raise Forbidden("malformed download URL") from None
        if not self.signer.check(f"{path}\n{when}", signature or ""):
            raise Forbidden("invalid download URL signature")
        if when <= now:
            raise Forbidden("download URL expired")


def _pack(root: Path) -> str:
    """A temporary ``.tar.gz`` of the regular files under ``root`` (links are left out, so a link
    planted in storage cannot pull in another file)."""
    fd, packed = tempfile.mkstemp(suffix=".tar.gz")
    with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
    return packed


def _check_ttl(ttl: int | None) -> float | None:
    if ttl is None:
        return None
    if not MIN_TTL_S <= ttl <= MAX_TTL_S:
        raise BadRequest(f"ttl_seconds must be between {MIN_TTL_S} and {MAX_TTL_S}, got {ttl!r}")
    return float(ttl)


def _link_tree(source: Path, target: Path) -> int:
    """Hard-link every file of ``source`` into ``target``; returns the bytes they hold."""
    shutil.rmtree(target, ignore_errors=True)
    size = 0
    for src in sorted(p for p in source.rglob("*") if p.is_file()):
        dst = target / src.relative_to(source)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        size += dst.stat().st_size
    return size


def copy_weights(
    api: TinkerApi, owner: str, body: types.CopyWeightsRequest, idem: str | None
) -> dict:
    """:func:`copy_checkpoint`; a retry with the same idempotency key answers the first copy."""
    memo = f"tinker/copy_weights/{owner}/{idem}" if idem else None
    if memo and (done := api.state.store.get(memo)):
        return done
    result = copy_checkpoint(api, owner, body)
    if memo:
        api.state.store.put(memo, result)
    return result


def copy_checkpoint(api: TinkerApi, owner: str, body: types.CopyWeightsRequest) -> dict:
    """The copy itself (see the module docstring); returns ``CopyWeightsResponse``."""
    if body.weights_access_token:
        raise BadRequest("weights_access_token is not supported: copy your own or public weights")
    ttl = _check_ttl(body.ttl_seconds)
    source = api.state.resolve_checkpoint_path(owner, body.source_path, True)
    run = api.state.get_run(source.owner, source.training_run_id)
    session_id, seq = body.session_id, body.model_seq_id
    if session_id is not None:
        if seq is None:
            raise BadRequest("copy_weights with session_id needs model_seq_id")
        api.state.get_session(owner, session_id)
    else:
        project = body.destination_project_id
        meta = {"project_id": project} if project else {}
        session_id = api.state.create_session(
            owner, tags=["copy_weights"], user_metadata=meta
        ).session_id
        seq = 0
    new_run = api.state.create_run(
        owner,
        session_id,
        run.base_model,
        run.lora_rank,
        model_seq_id=seq,
        lora_config=run.lora_config,
        user_metadata={"copied_from": source.tinker_path},
    )
    api.state.update_run(owner, new_run.training_run_id, status="unloaded")
    target = checkpoint_dir(
        api.ctx.storage_root, owner, new_run.training_run_id, source.kind, source.name
    )
    size = _link_tree(Path(source.local_dir), target)
    record, _ = api.state.add_checkpoint(
        owner,
        new_run.training_run_id,
        source.kind,
        source.name,
        str(target),
        size_bytes=size,
        ttl_seconds=ttl,
    )
    return {"tinker_path": record.tinker_path}


async def save_weights_external(
    api: TinkerApi, owner: str, body: types.SaveWeightsExternalRequest, idem: str | None
) -> dict:
    """``external_weights/<path>`` in PEFT layout, maybe age-encrypted (a sequenced call)."""
    call = api.open_call(owner, "save_weights_external", body, idem)
    model_id = body.model_id

    def prepare():
        run = api.run_of(owner, model_id)
        client = api.backends.model(run.base_model)
        name = validate_checkpoint_name(body.path)
        ttl = _check_ttl(body.ttl_seconds)
        recipients = body.age_encryption_recipients or []
        if len(recipients) > MAX_RECIPIENTS:
            raise BadRequest(f"at most {MAX_RECIPIENTS} age_encryption_recipients")
        age_recipients(recipients)  # refuse a malformed key now

        async def run_call() -> dict:
            saved = await client.call(
                owner,
                "tinker_save_external",
                {"adapter_name": model_id, "name": name, "age_encryption_recipients": recipients},
            )
            if ttl is not None:
                api.state.set_checkpoint_ttl(
                    owner, run.training_run_id, f"{EXTERNAL_KIND}/{name}", ttl
                )
            return {
                "path": convert.to_tinker_path(saved["path"]),
                "size_bytes": saved["size_bytes"],
                "type": "save_weights_external",
            }

        return run_call

    return await api.sequenced(call, prepare)


def external_weights_urls(
    api: TinkerApi, owner: str, run_id: str, kind: str, name: str, base: str
) -> dict:
    """One signed download URL (under ``base``, the API's URL) per file of the checkpoint."""
    if kind != EXTERNAL_KIND:
        raise BadRequest(f"only {EXTERNAL_KIND} checkpoints have download URLs, not {kind}")
    parse_checkpoint_path(f"tinker://{run_id}/{kind}/{name}")
    record = api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
    root = Path(record.local_dir)
    expires = int(api.state.clock() + URL_TTL_S)
    signer = UrlSigner(api.ctx.signer)
    urls = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        signed = f"{owner}/{run_id}/{name}/{rel}"
        urls[rel] = (
            f"{base}/{DOWNLOAD}/{quote(signed)}"
            f"?expires={expires}&signature={signer.sign(signed, expires)}"
        )
    return {"urls": urls, "expires": datetime.fromtimestamp(expires, timezone.utc).isoformat()}


def external_file(
    api: TinkerApi, owner: str, run_id: str, name: str, rel: str, expires: str, signature: str
) -> Path:
    """The file a signed download URL names (the signature is the credential: no API key)."""
    UrlSigner(api.ctx.signer).verify(
        f"{owner}/{run_id}/{name}/{rel}", expires, signature, api.state.clock()
    )
    record = api.state.get_checkpoint(owner, run_id, f"{EXTERNAL_KIND}/{name}")
    root = Path(record.local_dir).resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise NotFound(f"{rel} is not a file of this checkpoint")
    return path


def archive_url(api: TinkerApi, owner: str, run_id: str, kind: str, name: str, base: str) -> dict:
    """A signed URL (under ``base``) of a ``.tar.gz`` of the checkpoint, built when fetched."""
    parse_checkpoint_path(f"tinker://{run_id}/{kind}/{name}")
    api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
    expires = int(api.state.clock() + URL_TTL_S)
    signed = f"{owner}/{run_id}/{kind}/{name}"
    signature = UrlSigner(api.ctx.signer).sign("archive:" + signed, expires)
    return {
        "url": f"{base}/{ARCHIVES}/{quote(signed)}.tar.gz?expires={expires}&signature={signature}",
        "expires": datetime.fromtimestamp(expires, timezone.utc).isoformat(),
    }


async def packed_archive(
    api: TinkerApi, owner: str, run_id: str, kind: str, name: str, expires: str, signature: str
) -> str:
    """A temporary ``.tar.gz`` of the checkpoint a signed archive URL names (the caller
    deletes it once sent)."""
    signed = f"{owner}/{run_id}/{kind}/{name}"
    UrlSigner(api.ctx.signer).verify("archive:" + signed, expires, signature, api.state.clock())
    record = api.state.get_checkpoint(owner, run_id, f"{kind}/{name}")
    return await off_loop(_pack, Path(record.local_dir))


def join_sampling_session(
    api: TinkerApi, owner: str, body: types.JoinSamplingSessionRequest
) -> dict:
    """A new ``client_counter`` for a client rebuilt from a sampler handle."""
    sid = body.sampling_session_id
    api.state.get_sampling_session(owner, sid)
    counter = api.state.store.update(
        f"tinker/sampling_clients/{sid}", lambda v: {"n": (v or {"n": 0})["n"] + 1}
    )
    return {"type": "join_sampling_session", "client_counter": counter["n"]}


__all__ = [
    "UrlSigner",
    "archive_url",
    "copy_checkpoint",
    "copy_weights",
    "external_file",
    "external_weights_urls",
    "join_sampling_session",
    "packed_archive",
    "save_weights_external",
]
