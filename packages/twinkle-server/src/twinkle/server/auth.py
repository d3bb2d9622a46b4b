"""API-key authentication: who is calling, as a tenant id.

A caller presents an API key, or a short-lived JWT the server minted for one of its keys
(``auth/token``; :mod:`twinkle.server.signing`), which the Tinker SDK exchanges its key for. Keys come from the server config, a keys file (one per line, ``#`` comment lines) and the environment
variable ``TWINKLE_SERVER_API_KEYS`` (comma-separated). A server without any key refuses to start
unless anonymous access is requested explicitly. Only sha256 digests of the keys are kept; a
presented key is compared with every digest in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request

from twinkle._logging import get_logger
from twinkle.server.errors import Unauthorized
from twinkle.server.signing import looks_like_jwt
from twinkle.server.state.paths import tenant_id_for_key

logger = get_logger(__name__)

DEFAULT_ENV_VAR = "TWINKLE_SERVER_API_KEYS"
ANONYMOUS_TENANT = "anonymous"
TINKER_KEY_PREFIX = "tml-"
PUBLIC_PATHS = frozenset({"/healthz", "/api/v1/healthz", "/health"})
MISSING_KEY = "missing API key: send Authorization: Bearer <key> or X-API-Key"
INVALID_KEY = "invalid API key"
INVALID_TOKEN_CHALLENGE = 'Bearer error="invalid_token"'


class AuthError(Unauthorized):
    """A request without a valid key; ``status_code`` is 401.

    ``challenge`` is the ``WWW-Authenticate`` value: a rejected token says ``invalid_token``
    (RFC 6750), which tells the Tinker SDK to exchange its key for a fresh one and retry.
    """

    def __init__(self, status_code: int, detail: str, challenge: str = "Bearer") -> None:
        super().__init__(detail)
        self.status = self.status_code = status_code
        self.detail = detail
        self.challenge = challenge


class AuthConfigError(ValueError):
    """The key configuration is unusable (no key at all, unreadable keys file)."""


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: ``tenant_id`` scopes all state; ``key_hint`` is safe to log."""

    tenant_id: str
    key_hint: str


PUBLIC_PRINCIPAL = Principal(tenant_id="", key_hint="public")


def is_public_path(path: str) -> bool:
    """Whether ``path`` (health checks) is served without a key."""
    return path.rstrip("/") in PUBLIC_PATHS or path in PUBLIC_PATHS


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _hint(key: str) -> str:
    return f"...{key[-4:]}" if len(key) >= 12 else "***"


def read_keys_file(path: str | os.PathLike[str]) -> list[str]:
    """Keys in a file: one per line; blank lines and lines starting with ``#`` are ignored."""
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AuthConfigError(f"cannot read API keys file {path}: {exc}") from exc
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


class ApiKeyAuth:
    """Checks API keys and maps each to its tenant id.

    Args:
        keys: Keys from the server config.
        keys_file: A file of keys, one per line.
        env_var: Environment variable with comma-separated keys.
        allow_anonymous: With no key configured, serve everyone as tenant ``anonymous`` instead of
            refusing to start. Ignored when keys are configured.
        environ: The environment to read ``env_var`` from (default ``os.environ``).
        digests: Hex sha256 digests of further keys (``auth.api_key_sha256``).
        tokens: Verifies presented JWTs (``verify_jwt(token) -> claims``, raising ``ValueError``);
            without it only keys are accepted.

    Raises:
        AuthConfigError: No key configured and ``allow_anonymous`` is false, or the keys file
            cannot be read.
    """

    def __init__(
        self,
        keys: Iterable[str] = (),
        keys_file: str | os.PathLike[str] | None = None,
        env_var: str = DEFAULT_ENV_VAR,
        allow_anonymous: bool = False,
        environ: Mapping[str, str] | None = None,
        digests: Iterable[str] = (),
        tokens: Any = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        collected = [k.strip() for k in keys]
        if keys_file:
            collected += read_keys_file(keys_file)
        collected += [k.strip() for k in environ.get(env_var, "").split(",")]
        # key digest -> (tenant id, hint); the raw keys are not kept.
        self._keys: dict[bytes, tuple[str, str]] = {
            _digest(k): (tenant_id_for_key(k), _hint(k)) for k in collected if k
        }
        # Digests handed over by the launcher: the tenant id is the digest's first 16 hex digits,
        # as tenant_id_for_key computes it from the raw key.
        for hexdigest in digests:
            self._keys.setdefault(bytes.fromhex(hexdigest), (hexdigest[:16], f"#{hexdigest[:6]}"))
        self._tokens = tokens
        # A token names a tenant; it is accepted only while one of the tenant's keys still is.
        self._tenant_hints = {tenant: hint for tenant, hint in self._keys.values()}
        self.anonymous = not self._keys
        if self.anonymous and not allow_anonymous:
            raise AuthConfigError(
                "no API keys configured: set server api_keys / api_keys_file or "
                f"{env_var}=key1,key2 (or allow anonymous access explicitly)"
            )
        if self.anonymous:
            logger.warning(
                "no API keys configured: every request is served as tenant %r", ANONYMOUS_TENANT
            )

    @property
    def num_keys(self) -> int:
        """How many distinct keys are accepted."""
        return len(self._keys)

    def _match(self, key: str) -> tuple[str, str] | None:
        presented, found = _digest(key), None
        # No early exit: the time taken does not depend on which key matched.
        for digest, identity in self._keys.items():
            if hmac.compare_digest(presented, digest):
                found = identity
        return found

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The principal of a request, from ``X-API-Key`` or ``Authorization: Bearer``.

        A key sent as ``tml-<key>`` (the Tinker SDK's format) matches ``tml-<key>`` or ``<key>``.

        Raises:
            AuthError: 401, the key is missing or not valid.
        """
        if self.anonymous:
            return Principal(tenant_id=ANONYMOUS_TENANT, key_hint="anonymous")
        key = _presented_key(headers)
        if not key:
            raise AuthError(401, MISSING_KEY)
        identity = self._match(key)
        if identity is None and key.startswith(TINKER_KEY_PREFIX):
            identity = self._match(key[len(TINKER_KEY_PREFIX) :])
        if identity is None and self._tokens is not None and looks_like_jwt(key):
            return self._token_principal(key)
        if identity is None:
            raise AuthError(401, INVALID_KEY)
        return Principal(tenant_id=identity[0], key_hint=identity[1])

    def _token_principal(self, token: str) -> Principal:
        try:
            tenant = self._tokens.verify_jwt(token)["org_id"]
        except ValueError as exc:
            raise AuthError(401, f"invalid token: {exc}", INVALID_TOKEN_CHALLENGE) from None
        hint = self._tenant_hints.get(tenant)
        if hint is None:
            raise AuthError(
                401, "invalid token: its API key is no longer accepted", INVALID_TOKEN_CHALLENGE
            )
        return Principal(tenant_id=tenant, key_hint=f"token{hint}")


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents (``X-API-Key``, else ``Authorization: Bearer``), as sent.

    Only for the caller's own use within the request (the hub token rule of
    :mod:`twinkle.server.hub`); never store or log it.
    """
    return _presented_key(headers)


def caller_key(headers: Mapping[str, str], signer: Any) -> str | None:
    """The caller's API key: the presented one, or the one sealed in a presented token of ours.

    Only for the caller's own use within the request (the hub token rule); never store or log it.
    """
    key = _presented_key(headers)
    if key and looks_like_jwt(key):
        return signer.sealed_key(key)
    return key


def _presented_key(headers: Mapping[str, str]) -> str | None:
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    api_key = lowered.get("x-api-key", "").strip()
    if api_key:
        return api_key
    scheme, _, credentials = lowered.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


def require_principal(auth: ApiKeyAuth) -> Callable[[Request], Awaitable[Principal]]:
    """A FastAPI dependency that authenticates the request (public paths pass).

    The principal is also stored on ``request.state.principal``. Public paths get
    :data:`PUBLIC_PRINCIPAL`, whose empty tenant id owns nothing.
    """

    async def dependency(request: Request) -> Principal:
        if is_public_path(request.url.path):
            principal = PUBLIC_PRINCIPAL
        else:
            try:
                principal = auth.authenticate(request.headers)
            except AuthError as exc:
                raise HTTPException(
                    status_code=exc.status_code,
                    detail=exc.detail,
                    headers={"WWW-Authenticate": exc.challenge},
                ) from exc
        request.state.principal = principal
        return principal

    return dependency
