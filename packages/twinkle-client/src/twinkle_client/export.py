"""A checkpoint merged into its base model on the server: downloaded, or published to a hub.

The server merges (``POST /merged_exports``) once per checkpoint save and keeps the result for a
while; these functions ask for it, wait until it is built, and then download its files through
the signed URLs the server answers (no API key on those requests), or have the server upload it.
The directory is a standard Hugging Face model (``config.json``, tokenizer files, safetensors
weights, sharded with an index when large) that ``transformers`` and vLLM load as is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from twinkle_client.errors import BadRequestError, TwinkleClientError

API_PREFIX = "/api/v1"
DEFAULT_POLL_INTERVAL_S = 1.0
_CHUNK = 1 << 20


class MergedExportFailedError(BadRequestError):
    """The server could not build or publish the merged model (the message says why)."""


def export_merged(
    client: Any,
    checkpoint_path: str,
    out_dir: str | os.PathLike,
    *,
    max_shard_size: int | str | None = None,
    timeout: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL_S,
) -> Path:
    """Merge ``checkpoint_path`` (a ``twinkle://`` path of this key) into its base model on the
    server and download the result into ``out_dir``.

    Args:
        client: The connection (a :class:`~twinkle_client.client.TwinkleClient`).
        checkpoint_path: What ``save`` returned.
        out_dir: A new or empty directory.
        max_shard_size: The largest weights file (``"5GB"`` when ``None``).
        timeout: Seconds to wait for the merge (``None``: as long as the server allows).
        poll_interval: Seconds between status requests while it builds.

    Returns:
        ``out_dir``, holding the model.

    Raises:
        NotFoundError: No such checkpoint of this key.
        MergedExportFailedError: The merge failed on the server.
        TwinkleClientError: ``out_dir`` is not empty, the download broke, or ``timeout`` passed.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TwinkleClientError(f"out_dir {str(out)!r} exists and is not empty")
    body: dict[str, Any] = {"twinkle_path": checkpoint_path}
    if max_shard_size is not None:
        body["max_shard_size"] = max_shard_size
    status = client.http.post(f"{API_PREFIX}/merged_exports", body)
    status = _wait(
        lambda: client.http.get(f"{API_PREFIX}/merged_exports/{status['export_id']}"),
        status,
        ("ready",),
        timeout,
        poll_interval,
    )
    _download(status["files"], out, client.http.timeout)
    return out


def publish_merged(
    client: Any,
    checkpoint_path: str,
    repo_id: str,
    *,
    hub: str = "hf",
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    max_shard_size: int | str | None = None,
    wait: bool = True,
    timeout: float | None = None,
    poll_interval: float = 2.0,
) -> dict[str, Any]:
    """Have the server merge ``checkpoint_path`` and upload the model to ``repo_id``.

    Args:
        client: The connection (a :class:`~twinkle_client.client.TwinkleClient`).
        checkpoint_path: A ``twinkle://`` path of this key.
        repo_id: ``owner/name`` on the hub (created, private by default, when missing).
        hub: ``"hf"`` (Hugging Face: ``token`` is required) or ``"ms"`` (ModelScope: ``token``,
            else the server's token rule, see docs/checkpoints.md).
        token: The hub token, used for this upload only (never stored).
        private: Create the repository private (``None``: the server's default).
        commit_message: The commit's message.
        max_shard_size: As for :func:`export_merged`.
        wait: Wait until uploaded; ``False`` returns the first status (``publish_id``).
        timeout: Seconds to wait.
        poll_interval: Seconds between status requests.

    Returns:
        The status: ``status`` (``uploaded`` when waited for), ``url``, ``files``, ``repo_id``.

    Raises:
        BadRequestError: A token the hub refuses, a hub that cannot be reached, a bad field.
        MergedExportFailedError: The merge or the upload failed in the background.
    """
    body: dict[str, Any] = {"twinkle_path": checkpoint_path, "repo_id": repo_id, "hub": hub}
    extra = {
        "token": token,
        "private": private,
        "commit_message": commit_message,
        "max_shard_size": max_shard_size,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    status = client.http.post(f"{API_PREFIX}/merged_exports/publish", body)
    if not wait:
        return status
    return _wait(
        lambda: client.http.get(f"{API_PREFIX}/merged_exports/publish/{status['publish_id']}"),
        status,
        ("uploaded",),
        timeout,
        poll_interval,
    )


def _wait(fetch, status, done, timeout, poll_interval) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while status["status"] not in done:
        if status["status"] == "failed":
            raise MergedExportFailedError(status.get("error") or "failed", status=400)
        if deadline is not None and time.monotonic() > deadline:
            raise TwinkleClientError(f"still {status['status']} after {timeout} s; ask again later")
        time.sleep(poll_interval)
        status = fetch()
    return status


def _download(files: dict[str, str], out: Path, timeout: float) -> None:
    """Each file through its signed URL into ``out``; all or nothing."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0)) as http:
            for name, url in sorted(files.items()):
                if Path(name).name != name or name.startswith("."):
                    raise TwinkleClientError(f"the server named an unsafe file {name!r}")
                partial = out / f".{name}.partial"
                written.append(partial)
                with http.stream("GET", url) as response, open(partial, "wb") as sink:
                    if response.status_code != 200:
                        response.read()
                        raise TwinkleClientError(
                            f"downloading {name} failed: HTTP {response.status_code} "
                            f"{response.text[:200]}"
                        )
                    for chunk in response.iter_bytes(_CHUNK):
                        sink.write(chunk)
                os.replace(partial, out / name)
                written[-1] = out / name
    except httpx.HTTPError as exc:
        _remove(written)
        raise TwinkleClientError(f"downloading the merged model broke: {exc}") from None
    except BaseException:
        _remove(written)
        raise


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


__all__ = ["MergedExportFailedError", "export_merged", "publish_merged"]
