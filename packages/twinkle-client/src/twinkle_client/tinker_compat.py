"""Point the official ``tinker`` SDK at a Twinkle server: :func:`init_tinker_client`.

The SDK stays unmodified on disk; this patches it in memory (idempotently) so that
- any Twinkle API key works: keys without the ``tml-`` prefix are sent as ``tml-<key>``, which a
  Twinkle server maps back to ``<key>``;
- every request carries ``Authorization: Bearer <key>`` and an ``X-Ray-Serve-Request-Id``;
- ``twinkle://`` checkpoint paths are accepted wherever the SDK wants ``tinker://``;
- ``TWINKLE_SERVER_URL`` / ``TWINKLE_SERVER_TOKEN`` become the defaults of ``ServiceClient``.

No torch import here: this module only touches the SDK's HTTP layer.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import uuid
from typing import Any, overload
from urllib.parse import urlsplit

from twinkle_client.env import (
    TINKER_API_KEY,
    TINKER_BASE_URL,
    TWINKLE_SERVER_TOKEN,
    TWINKLE_SERVER_URL,
)

TINKER_PREFIX = "tml-"
_PATCHED = "_twinkle_patched"


def to_tinker_path(path: Any) -> Any:
    """``twinkle://x`` -> ``tinker://x``; anything else is returned unchanged."""
    if isinstance(path, str) and path.startswith("twinkle://"):
        return "tinker://" + path[len("twinkle://") :]
    return path


@overload
def tinker_api_key(key: str) -> str: ...
@overload
def tinker_api_key(key: None) -> None: ...
def tinker_api_key(key: str | None) -> str | None:
    """A key the SDK accepts: ``tml-`` keys and JWTs as they are, others prefixed with ``tml-``."""
    if not key or key.startswith((TINKER_PREFIX, "eyJ")):
        return key
    return TINKER_PREFIX + key


def init_tinker_client(base_url: str | None = None, api_key: str | None = None) -> None:
    """Patch the installed ``tinker`` SDK to talk to a Twinkle server. Call before creating clients.

    Args:
        base_url: Default server URL (else ``TWINKLE_SERVER_URL``, else the SDK's own default).
        api_key: Default API key (else ``TWINKLE_SERVER_TOKEN``, else ``TINKER_API_KEY``).

    Calling it again only updates the defaults.
    """
    base_url = base_url or TWINKLE_SERVER_URL.get()
    api_key = api_key or TWINKLE_SERVER_TOKEN.get()
    if base_url:
        os.environ[TINKER_BASE_URL.name] = base_url
    sdk_key = TINKER_API_KEY.get()
    if api_key:
        os.environ[TINKER_API_KEY.name] = tinker_api_key(api_key)
    elif sdk_key:
        os.environ[TINKER_API_KEY.name] = tinker_api_key(sdk_key)
    import tinker

    if getattr(tinker, _PATCHED, False):
        return
    _patch_service_client()
    _patch_auth()
    _patch_paths()
    setattr(tinker, _PATCHED, True)


def init_tinker_compat_client(
    base_url: str | None = None, api_key: str | None = None, **kwargs: Any
) -> Any:
    """ModelScope Twinkle's spelling: :func:`init_tinker_client`, then a ``tinker.ServiceClient``
    for ``base_url`` (``kwargs`` go to the ``ServiceClient``).

    Returns:
        The ``tinker.ServiceClient``.

    Raises:
        ConnectionError: The server cannot be reached (checked once, within seconds: the SDK
            itself would retry for minutes).
    """
    init_tinker_client(base_url, api_key)
    from tinker import ServiceClient

    _check_reachable(TINKER_BASE_URL.get())
    return ServiceClient(**kwargs)


def _check_reachable(url: str | None, timeout_s: float = 5.0) -> None:
    if not url:
        return
    parts = urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Tinker server at {url}: {exc}") from None


def _patch_service_client() -> None:
    from tinker.lib.public_interfaces.service_client import ServiceClient

    original = ServiceClient.__init__
    # SDKs before 0.33 take extra headers as ``default_headers`` (passed on to the HTTP client).
    takes_overrides = "default_headers_overrides" in inspect.signature(original).parameters

    @functools.wraps(original)
    def __init__(
        self,
        *args: Any,
        api_key: str | None = None,
        default_headers_overrides: Any = None,
        **kwargs: Any,
    ):
        key = tinker_api_key(api_key or TINKER_API_KEY.get())
        headers = dict(default_headers_overrides or {})
        if key:
            raw = key[len(TINKER_PREFIX) :] if key.startswith(TINKER_PREFIX) else key
            headers.setdefault("Authorization", f"Bearer {raw}")
        if takes_overrides:
            kwargs["default_headers_overrides"] = headers
        else:
            kwargs["default_headers"] = {**headers, **kwargs.get("default_headers", {})}
        original(self, *args, api_key=key, **kwargs)

    # Patching the SDK's method in place; mypy forbids assigning to a method.
    ServiceClient.__init__ = __init__  # type: ignore[method-assign]


def _patch_auth() -> None:
    """Prefix bare keys, and give every request its own ``X-Ray-Serve-Request-Id``.

    SDKs from 0.27 authenticate through ``tinker.lib._auth_token_provider``; older ones (0.16.1,
    which ModelScope Twinkle pins) send the key as built by the patched ``ServiceClient``, so only
    the request id is added, where those SDKs build each request's headers.
    """
    try:
        from tinker.lib import _auth_token_provider as auth
    except ImportError:
        _patch_request_ids()
        return

    original_init = auth.ApiKeyAuthProvider.__init__

    @functools.wraps(original_init)
    def __init__(self, api_key: str) -> None:
        original_init(self, tinker_api_key(api_key))

    # Patching the SDK's method in place; mypy forbids assigning to a method.
    auth.ApiKeyAuthProvider.__init__ = __init__  # type: ignore[method-assign]
    original_flow = auth.AuthTokenProvider.async_auth_flow

    async def async_auth_flow(self, request):
        request.headers.setdefault("X-Ray-Serve-Request-Id", uuid.uuid4().hex)
        flow = original_flow(self, request)
        response = None
        try:
            while True:
                sent = await flow.asend(response)
                response = yield sent
        except StopAsyncIteration:
            return

    # Patching the SDK's method in place; mypy forbids assigning to a method.
    auth.AuthTokenProvider.async_auth_flow = async_auth_flow  # type: ignore[method-assign]


def _patch_request_ids() -> None:
    from tinker._base_client import BaseClient

    original = BaseClient._build_headers

    @functools.wraps(original)
    def _build_headers(self, *args: Any, **kwargs: Any):
        headers = original(self, *args, **kwargs)
        headers.setdefault("X-Ray-Serve-Request-Id", uuid.uuid4().hex)
        return headers

    # Patching the SDK's method in place; mypy forbids assigning to a method.
    BaseClient._build_headers = _build_headers  # type: ignore[method-assign]


def _patch_paths() -> None:
    """Accept ``twinkle://`` paths where the SDK checks for ``tinker://``."""
    from tinker import types
    from tinker.lib import internal_client_holder as holder
    from tinker.lib.public_interfaces import service_client, training_client

    ParsedPath, Holder = types.ParsedCheckpointTinkerPath, holder.InternalClientHolder
    # A classmethod read from its class is a bound method, whose __func__ takes ``cls`` again (so
    # the patch still builds subclasses); the SDK's annotation of it as a plain callable hides that.
    parse = ParsedPath.from_tinker_path.__func__  # type: ignore[attr-defined]

    def from_tinker_path(cls, tinker_path: str):
        return parse(cls, to_tinker_path(tinker_path))

    # Patching the SDK's classmethod in place; mypy forbids assigning to a method (and its type).
    patched = classmethod(from_tinker_path)
    ParsedPath.from_tinker_path = patched  # type: ignore[method-assign,assignment]

    create_session = Holder._create_sampling_session

    async def _create_sampling_session(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> str:
        return await create_session(
            self, model_path=to_tinker_path(model_path), base_model=base_model
        )

    # Patching the SDK's method in place; mypy forbids assigning to a method.
    Holder._create_sampling_session = _create_sampling_session  # type: ignore[method-assign]
    for cls, names in (
        (
            service_client.ServiceClient,
            (
                "create_training_client_from_state",
                "create_training_client_from_state_with_optimizer",
                "create_sampling_client",
            ),
        ),
        (
            training_client.TrainingClient,
            ("load_state", "load_state_with_optimizer", "create_sampling_client"),
        ),
    ):
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, _first_path_arg(getattr(cls, name)))


def _first_path_arg(method):
    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any):
        if args:
            args = (to_tinker_path(args[0]), *args[1:])
        for key in ("path", "model_path"):
            if key in kwargs:
                kwargs[key] = to_tinker_path(kwargs[key])
        return method(self, *args, **kwargs)

    return wrapper


__all__ = ["init_tinker_client", "init_tinker_compat_client", "tinker_api_key", "to_tinker_path"]
