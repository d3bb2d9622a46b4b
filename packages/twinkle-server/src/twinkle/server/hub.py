"""Publishing a tenant's checkpoint to the ModelScope hub: which token, which repository.

Both the Twinkle-native ``upload_to_hub`` operation and Tinker's ``publish`` route come here; the
upload itself is :func:`twinkle.hub.upload.upload_to_hub`. A merged model
(:mod:`twinkle.server.export`) goes to the Hugging Face Hub through :func:`upload_folder_to_hf`,
with the caller's own Hugging Face token only.

The token rule (``hub.caller_key`` in the server config):

- ``first`` (default, the seed's rule: "set a valid ModelScope token as the api_key"): the
  caller's API key first; the server's token when the hub does not accept it.
- ``if_no_server_token``: the server's own token (``$MODELSCOPE_API_TOKEN``, or the variable
  ``hub.token_env`` names); only a server without one offers the caller's API key.
- ``never``: the server's token only.

A hub that cannot be reached, or that fails a call, ends the publish at once with a 400 naming the
hub's address (:meth:`HubPublisher.token_for` checks the connection first, within
``REACH_DEADLINE_S``): a retry by the client would meet the same hub, so none is invited.

"The caller's API key" is the key of the request itself (``X-API-Key`` or ``Authorization:
Bearer``, without the ``tml-`` prefix the Tinker SDK adds). It is offered to the hub only by
asking who owns it (``whoami``); it is used for that caller's own publish only, passed to
``HubApi`` for that one call, and never stored or logged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.env import environ as process_environ
from twinkle.server.env import HF_ENDPOINT, MODELSCOPE_ENDPOINT, TWINKLE_HUB_NAMESPACE
from twinkle.server.web.errors import BadRequest

logger = logging.getLogger("twinkle.server.hub")

TINKER_KEY_PREFIX = "tml-"
NAMESPACE_ENV = TWINKLE_HUB_NAMESPACE.name
#: Seconds a publish waits to learn whether the hub accepts connections at all (name lookup
#: included, which the socket's own timeout does not bound).
REACH_DEADLINE_S = 8.0


@dataclass(frozen=True)
class HubToken:
    """The token of one publish and whose it is (``source``: ``caller`` or ``server``)."""

    token: str
    source: str
    username: str | None = None

    def __repr__(self) -> str:  # never show the token
        return f"HubToken(source={self.source!r}, username={self.username!r})"


@dataclass(frozen=True)
class HubPublisher:
    """The server's hub settings and the token rule (see the module docstring).

    Attributes:
        endpoint: The hub's address (``None``: modelscope's default).
        token_env: The environment variable of the server's own token.
        namespace: Where Tinker publishes with the server's token (``None``:
            ``$TWINKLE_HUB_NAMESPACE``, else the token's user).
        caller_key: ``if_no_server_token``, ``first`` or ``never``.
        private: New repositories are private.
    """

    endpoint: str | None = None
    token_env: str = "MODELSCOPE_API_TOKEN"
    namespace: str | None = None
    caller_key: str = "first"
    private: bool = True

    @classmethod
    def from_config(cls, config: Any) -> HubPublisher:
        """From the server config's ``hub`` section (``HubConfig``)."""
        return cls(
            config.endpoint, config.token_env, config.namespace, config.caller_key, config.private
        )

    def token_for(self, presented_key: str | None) -> HubToken:
        """The token a caller presenting ``presented_key`` publishes with.

        Raises:
            BadRequest: No token can be used (the message says what to configure), or the hub
                cannot be reached or failed.
        """
        server = (process_environ().get(self.token_env) or "").strip()
        caller = _hub_key(presented_key) if self.caller_key != "never" else None
        if caller or server:
            self.check_reachable()
        if caller and (self.caller_key == "first" or not server):
            from twinkle.hub.upload import hub_username

            with self.hub_errors():
                username = hub_username(caller, self.endpoint)
            if username:
                return HubToken(caller, "caller", username)
        if server:
            return HubToken(server, "server")
        rejected = (
            " the hub did not accept your API key as a ModelScope token, and" if caller else ""
        )
        raise BadRequest(
            f"cannot publish:{rejected} this server has no hub token of its own (the operator "
            f"sets ${self.token_env}; or connect with your ModelScope token as the API key)"
        )

    def repo_id(self, token: HubToken, repo_name: str) -> str:
        """``<namespace>/<repo_name>``: the caller's user for the caller's token, else the
        configured namespace or the server token's user."""
        namespace = token.username if token.source == "caller" else None
        namespace = namespace or self.namespace or TWINKLE_HUB_NAMESPACE.get()
        if not namespace:
            from twinkle.hub.upload import hub_username

            with self.hub_errors():
                namespace = hub_username(token.token, self.endpoint)
        if not namespace:
            raise BadRequest(
                f"cannot tell the hub namespace to publish to: set hub.namespace or ${NAMESPACE_ENV}"
            )
        return f"{namespace}/{repo_name}"

    def upload(
        self,
        directory: str | Path,
        hub_model_id: str,
        token: HubToken,
        *,
        async_upload: bool = False,
        private: bool | None = None,
        commit_message: str | None = None,
    ) -> dict[str, Any]:
        """Upload the checkpoint in ``directory``; with ``async_upload``, start it and return.

        Returns:
            ``hub_model_id``, ``token`` (``caller``/``server``), then ``files`` and ``url`` once
            uploaded, or ``status: "started"`` for a background upload (its failure is logged).
        """
        from twinkle.hub.upload import adapter_files, upload_to_hub

        kwargs = {
            "token": token.token,
            "endpoint": self.endpoint,
            "private": self.private if private is None else private,
            "commit_message": commit_message,
        }
        reply = {"hub_model_id": hub_model_id, "token": token.source}
        if async_upload:
            adapter_files(directory)  # refuse a broken checkpoint now, not in the background
            future = upload_to_hub(directory, hub_model_id, async_upload=True, **kwargs)
            future.add_done_callback(lambda f: _log_outcome(hub_model_id, f))
            return {**reply, "status": "started"}
        with self.hub_errors():
            result = upload_to_hub(directory, hub_model_id, **kwargs)
        return {**reply, "status": "uploaded", "files": list(result.files), "url": result.url}

    def address(self) -> str | None:
        """The hub's address as modelscope reaches it (``None`` without modelscope)."""
        try:
            from modelscope.hub.api import HubApi
        except ImportError:
            return None
        return HubApi(endpoint=self.endpoint or MODELSCOPE_ENDPOINT.get()).endpoint

    def check_reachable(self, deadline_s: float | None = None) -> None:
        """Return once the hub accepts a connection; else a 400 within ``deadline_s`` seconds
        (default ``REACH_DEADLINE_S``).

        Raises:
            BadRequest: The hub cannot be reached (the message names its address).
        """
        deadline_s = REACH_DEADLINE_S if deadline_s is None else deadline_s
        address = self.address()
        if address is None:  # the upload itself says that modelscope is missing
            return
        from twinkle.hub.upload import check_reachable

        outcome: list[BaseException | None] = []

        def attempt() -> None:
            try:
                check_reachable(address, timeout=deadline_s)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                outcome.append(exc)

        # A daemon thread: a name lookup that hangs past the deadline is left behind, not joined.
        thread = threading.Thread(target=attempt, name="twinkle-hub-reach", daemon=True)
        thread.start()
        thread.join(deadline_s)
        if not outcome:
            raise BadRequest(
                f"cannot reach the ModelScope hub at {address} (no answer within "
                f"{deadline_s:g} s); check the network or the hub address ($MODELSCOPE_ENDPOINT, "
                "the server config's hub.endpoint)"
            )
        if outcome[0] is not None:
            raise BadRequest(str(outcome[0])) from None

    @contextlib.contextmanager
    def hub_errors(self) -> Iterator[None]:
        """Any failure of the hub itself as a 400 naming the hub (a retry meets the same hub)."""
        from twinkle.errors import TwinkleError

        try:
            yield
        except TwinkleError:
            raise  # ours: already a clear 4xx (twinkle.server.web.errors)
        except Exception as exc:  # noqa: BLE001 - modelscope's and requests' errors alike
            if not _from_hub(exc):
                raise
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadRequest(
                f"the ModelScope hub at {self.address()} failed the publish "
                f"({type(exc).__name__}: {reason})"
            ) from None


def _hub_key(presented_key: str | None) -> str | None:
    key = (presented_key or "").strip()
    return key[len(TINKER_KEY_PREFIX) :] if key.startswith(TINKER_KEY_PREFIX) else key or None


def _from_hub(exc: BaseException) -> bool:
    """An error raised by modelscope's client or by ``requests`` under it."""
    module = type(exc).__module__ or ""
    return module.startswith(("modelscope", "requests", "urllib3"))


def _log_outcome(hub_model_id: str, future: Any) -> None:
    error = future.exception()
    if error is None:
        logger.info("uploaded to the hub: %s", hub_model_id)
    else:
        logger.error("upload to the hub failed: %s: %s", hub_model_id, error)


#: The variable naming the Hugging Face Hub's address (huggingface_hub's own), read per upload.
HF_ENDPOINT_ENV = HF_ENDPOINT.name
HF_DEFAULT_ENDPOINT = HF_ENDPOINT.default


def hf_endpoint(endpoint: str | None = None) -> str:
    """The Hugging Face Hub's address: ``endpoint``, else ``$HF_ENDPOINT`` as set now, else
    huggingface.co (huggingface_hub reads its variable once, at import)."""
    return (endpoint or HF_ENDPOINT.get() or HF_DEFAULT_ENDPOINT).rstrip("/")


def check_hf_token(token: str | None, endpoint: str | None = None) -> str:
    """The Hugging Face user owning ``token``; asked before an upload starts, so that a missing
    or refused token, or a hub that cannot be reached, is a 400 at once.

    The token is the caller's own, passed for this one upload: it is never stored or logged, and
    the server's own Hugging Face login (if any) is never used.

    Raises:
        BadRequest: No token, a token the hub refuses, or a hub that cannot be reached.
    """
    if not isinstance(token, str) or not token.strip():
        raise BadRequest("token: a Hugging Face access token (with write access) is required")
    address = hf_endpoint(endpoint)
    _check_hf_reachable(address)
    from huggingface_hub import HfApi

    with _hf_errors(address):
        info = HfApi(endpoint=address).whoami(token=token.strip(), cache=False)
    return str(info.get("name") or "")


def upload_folder_to_hf(
    directory: str | Path,
    repo_id: str,
    token: str,
    *,
    endpoint: str | None = None,
    private: bool = True,
    commit_message: str | None = None,
) -> dict[str, Any]:
    """Create ``repo_id`` (a model repository) if it is missing and upload every file of
    ``directory`` to it in one commit, through ``huggingface_hub``'s own client.

    Returns:
        ``hub`` (``"hf"``), ``hub_model_id``, ``files`` (uploaded, by name), ``url`` and
        ``commit``.

    Raises:
        BadRequest: The hub refused the token or the write, or cannot be reached.
    """
    from huggingface_hub import HfApi

    address = hf_endpoint(endpoint)
    api = HfApi(endpoint=address, token=token.strip())
    files = sorted(p.name for p in Path(directory).iterdir() if p.is_file())
    with _hf_errors(address):
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            repo_type="model",
            folder_path=str(directory),
            commit_message=commit_message or f"Upload {repo_id} from Twinkle",
        )
    return {
        "hub": "hf",
        "hub_model_id": repo_id,
        "files": files,
        "url": f"{address}/{repo_id}",
        "commit": commit.oid,
    }


def _check_hf_reachable(address: str, deadline_s: float = REACH_DEADLINE_S) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=deadline_s):
            pass
    except OSError as exc:
        raise BadRequest(
            f"cannot reach the Hugging Face hub at {address} ({exc}); check the network or "
            f"${HF_ENDPOINT_ENV}"
        ) from None


@contextlib.contextmanager
def _hf_errors(address: str) -> Iterator[None]:
    """huggingface_hub's and httpx's failures as a 400 naming the hub (a retry meets the same
    hub); a refused token says so."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if status in (401, 403):
            raise BadRequest(
                f"the Hugging Face hub at {address} refused the token ({status}: {reason}); "
                "give a token with write access to the repository"
            ) from None
        raise BadRequest(f"the Hugging Face hub at {address} failed ({reason})") from None
    except (OSError, httpx.TransportError) as exc:  # the connection, not an answer
        raise BadRequest(f"cannot reach the Hugging Face hub at {address} ({exc})") from None


__all__ = [
    "HubPublisher",
    "HubToken",
    "check_hf_token",
    "hf_endpoint",
    "upload_folder_to_hf",
]
