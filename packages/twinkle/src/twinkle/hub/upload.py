"""Upload a checkpoint's adapter to the ModelScope hub, through modelscope's own ``HubApi``.

Only the adapter files of a checkpoint leave the machine (:data:`UPLOADED_FILES`): the PEFT config,
the PEFT weights and a ``README.md`` when the directory has one. Training state (optimizer,
scheduler, RNG, pending gradients, ``trainer_state.json``) stays local: it is only useful for
resuming here, and it is several times the size of the adapter. The files are staged in a
temporary directory, so nothing (not even modelscope's upload cache) is written into the
checkpoint.

The token is the ``token`` argument, else ``$MODELSCOPE_API_TOKEN``, else the login saved by
``modelscope login``. It is handed to ``HubApi`` for this upload only: it is never saved to disk
(no ``HubApi.login``) and never logged.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from twinkle.env import MODELSCOPE_API_TOKEN, MODELSCOPE_ENDPOINT
from twinkle.errors import (
    HubUnreachableError,
    HubUploadError,
    InvalidArgumentError,
    PathNotFoundError,
    TwinkleError,
)

TOKEN_ENV = MODELSCOPE_API_TOKEN.name
ENDPOINT_ENV = MODELSCOPE_ENDPOINT.name
REQUIRED_FILES = ("adapter_config.json", "adapter_model.safetensors")
UPLOADED_FILES = (*REQUIRED_FILES, "README.md")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")
#: Seconds to wait for a TCP connection to the hub before reporting it unreachable.
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HubUpload:
    """A finished upload.

    Attributes:
        hub_model_id: The repository (``owner/name``).
        files: The files uploaded, by name.
        url: The repository's page on the hub.
    """

    hub_model_id: str
    files: tuple[str, ...]
    url: str


def adapter_files(checkpoint_dir: str | os.PathLike) -> tuple[str, ...]:
    """The names of the files of ``checkpoint_dir`` that an upload sends.

    Raises:
        PathNotFoundError: The directory does not exist or lacks the adapter files.
    """
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise PathNotFoundError(f"checkpoint directory {str(directory)!r} does not exist")
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise PathNotFoundError(
            f"{str(directory)!r} is not an adapter checkpoint: {', '.join(missing)} missing"
        )
    return tuple(name for name in UPLOADED_FILES if (directory / name).is_file())


def upload_to_hub(
    checkpoint_dir: str | os.PathLike,
    hub_model_id: str,
    *,
    token: str | None = None,
    async_upload: bool = False,
    endpoint: str | None = None,
    private: bool = True,
    commit_message: str | None = None,
) -> HubUpload | Future[HubUpload]:
    """Create ``hub_model_id`` on the hub if it is missing and upload the checkpoint's adapter.

    Args:
        checkpoint_dir: A checkpoint directory (what ``save`` returned).
        hub_model_id: The repository, ``owner/name``.
        token: A ModelScope access token (default ``$MODELSCOPE_API_TOKEN``, then the saved
            ``modelscope login``).
        async_upload: Upload in a background thread and return a ``Future`` at once; its
            ``result()`` waits for the upload and raises what it raised.
        endpoint: The hub's address (default ``$MODELSCOPE_ENDPOINT`` as set now, else
            modelscope's default, https://www.modelscope.cn).
        private: Create the repository private (an existing one keeps its visibility).
        commit_message: The commit's message (default names the checkpoint).

    Returns:
        The :class:`HubUpload`, or a ``Future`` of it with ``async_upload``.

    Raises:
        InvalidArgumentError: ``hub_model_id`` is not ``owner/name``.
        PathNotFoundError: ``checkpoint_dir`` is not an adapter checkpoint.
        HubUploadError: modelscope is not installed, no token, or the hub rejected the token.
    """
    if not isinstance(hub_model_id, str) or not _REPO_ID.fullmatch(hub_model_id):
        raise InvalidArgumentError(
            f"hub_model_id must be 'owner/name' (letters, digits, '-', '_', '.'), got {hub_model_id!r}"
        )
    directory = Path(checkpoint_dir)
    files = adapter_files(directory)
    hub_api = _hub_api_class()
    token = _token(token)
    message = commit_message or f"Upload {directory.name} from Twinkle"

    def run() -> HubUpload:
        return _upload(hub_api, directory, files, hub_model_id, token, endpoint, private, message)

    if not async_upload:
        return run()
    future: Future[HubUpload] = Future()

    def background() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever calls result()
            future.set_exception(exc)

    # Not a daemon: a script that ends right after an async upload still finishes it.
    threading.Thread(target=background, name="twinkle-hub-upload").start()
    return future


def hub_username(token: str, endpoint: str | None = None) -> str | None:
    """The hub user owning ``token``, or ``None`` when the hub does not accept it as a token.

    Raises:
        HubUploadError: modelscope is not installed.
    """
    hub_api = _hub_api_class()
    from modelscope_hub.errors import AuthenticationError, PermissionDeniedError

    api = hub_api(endpoint=_endpoint(endpoint), token=token)
    check_reachable(api.endpoint)
    try:
        return api.whoami().username or None
    except (AuthenticationError, PermissionDeniedError):
        return None
    except _network_errors() as exc:
        raise _unreachable(api.endpoint, exc) from None


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to the hub at ``endpoint``.

    modelscope retries a refused or unresolvable address for a quarter of a minute per call;
    this answers within ``timeout`` seconds.

    Raises:
        HubUnreachableError: No connection within ``timeout`` seconds.
    """
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            pass
    except OSError as exc:
        raise _unreachable(endpoint, exc) from None


def _unreachable(endpoint: str, exc: BaseException) -> HubUnreachableError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return HubUnreachableError(
        f"cannot reach the ModelScope hub at {endpoint} ({reason}); check the network or the "
        f"hub address (${ENDPOINT_ENV}, the server's hub.endpoint)"
    )


def _network_errors() -> tuple[type[BaseException], ...]:
    import requests
    from modelscope_hub.errors import NetworkError

    return (NetworkError, requests.ConnectionError, requests.Timeout)


def _upload(hub_api, directory, files, hub_model_id, token, endpoint, private, message):
    from modelscope_hub.errors import AuthenticationError, PermissionDeniedError

    api = hub_api(endpoint=_endpoint(endpoint), token=token)
    check_reachable(api.endpoint)
    try:
        api.create_repo(hub_model_id, visibility="private" if private else "public", exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="twinkle-hub-upload-") as staging:
            for name in files:
                shutil.copyfile(directory / name, Path(staging) / name)
            api.upload_folder(
                repo_id=hub_model_id,
                folder_path=staging,
                commit_message=message,
                use_cache=False,
                disable_tqdm=True,
            )
    except (AuthenticationError, PermissionDeniedError) as exc:
        raise HubUploadError(
            f"the hub refused to let this token write {hub_model_id!r} "
            f"({str(exc).splitlines()[0]}). Check the "
            f"ModelScope token (the token argument, ${TOKEN_ENV}, or the API key you gave)"
        ) from None
    except _network_errors() as exc:
        raise _unreachable(api.endpoint, exc) from None
    return HubUpload(hub_model_id, files, f"{api.endpoint}/models/{hub_model_id}")


def _hub_api_class():
    try:
        from modelscope.hub.api import HubApi
    except ImportError:
        raise HubUploadError(
            "uploading to the hub needs the modelscope package: pip install modelscope"
        ) from None
    return HubApi


def _endpoint(endpoint: str | None) -> str | None:
    # modelscope reads its environment once per process; a later change would go unseen.
    return endpoint or MODELSCOPE_ENDPOINT.get() or None


def _token(token: str | None) -> str:
    token = (token or MODELSCOPE_API_TOKEN.get() or "").strip() or _saved_login()
    if not token:
        raise HubUploadError(
            f"no ModelScope token: pass token=..., set {TOKEN_ENV}, or run `modelscope login` "
            "(against a Twinkle server, the API key you connect with is the token)"
        )
    return token


def _saved_login() -> str:
    from modelscope_hub.config import HubConfig

    return (HubConfig().load_token() or "").strip()


@dataclass
class _Tracked:
    owner: str
    hub_model_id: str
    future: Future
    info: dict[str, Any] = field(default_factory=dict)
    finished_at: float | None = None


class UploadTracker:
    """Background uploads by id, each visible to the owner that started it only.

    Args:
        keep_s: Seconds a finished upload's status stays available.
        clock: Wall-clock seconds (tests pass a fake one).
    """

    def __init__(self, keep_s: float = 3600.0, clock=time.time) -> None:
        self.keep_s, self.clock = keep_s, clock
        self._uploads: dict[str, _Tracked] = {}
        self._lock = threading.Lock()

    def start(self, owner: str, hub_model_id: str, future: Future, **info: Any) -> dict[str, Any]:
        """Track ``future`` (an ``upload_to_hub(..., async_upload=True)``); returns its status.

        ``info`` is reported with every status (e.g. whose token it uses)."""
        upload_id = uuid.uuid4().hex
        tracked = _Tracked(owner, hub_model_id, future, dict(info))
        future.add_done_callback(lambda _: setattr(tracked, "finished_at", self.clock()))
        with self._lock:
            self._purge()
            self._uploads[upload_id] = tracked
        return self._status(upload_id, tracked)

    def status(self, owner: str, upload_id: str) -> dict[str, Any] | None:
        """The upload's status, or ``None`` for an unknown id or another owner's upload:
        ``status`` is ``started``, ``uploaded`` (with ``files`` and ``url``) or ``failed``
        (with ``error``)."""
        with self._lock:
            self._purge()
            tracked = self._uploads.get(upload_id)
        if tracked is None or tracked.owner != owner:
            return None
        return self._status(upload_id, tracked)

    def _status(self, upload_id: str, tracked: _Tracked) -> dict[str, Any]:
        status = {"upload_id": upload_id, "hub_model_id": tracked.hub_model_id, **tracked.info}
        future = tracked.future
        if not future.done():
            return {**status, "status": "started"}
        error = future.exception()
        if error is None:
            result = future.result()
            return {**status, "status": "uploaded", "files": list(result.files), "url": result.url}
        return {**status, "status": "failed", "error": describe_failure(error)}

    def _purge(self) -> None:
        now = self.clock()
        for upload_id, tracked in list(self._uploads.items()):
            if tracked.finished_at is not None and now - tracked.finished_at > self.keep_s:
                del self._uploads[upload_id]


def describe_failure(error: BaseException) -> str:
    """What a failed upload reports: our own errors' messages as they are, others' first line
    with their type."""
    if isinstance(error, TwinkleError):
        return str(error)
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


__all__ = [
    "CONNECT_TIMEOUT_S",
    "ENDPOINT_ENV",
    "REQUIRED_FILES",
    "TOKEN_ENV",
    "UPLOADED_FILES",
    "HubUpload",
    "HubUnreachableError",
    "HubUploadError",
    "UploadTracker",
    "adapter_files",
    "check_reachable",
    "describe_failure",
    "hub_username",
    "upload_to_hub",
]
