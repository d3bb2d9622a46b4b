"""API-key authentication: who is calling, as a tenant id.

A caller presents an API key, or a short-lived JWT the server minted for one of its keys
(``auth/token``; :mod:`twinkle.server.web.signing`), which the Tinker SDK exchanges its key for.
Keys come from the server config, a keys file (one per line, ``#`` comment lines) and the
environment variable ``TWINKLE_SERVER_API_KEYS`` (comma-separated). A server without any key
refuses to start unless anonymous access is requested explicitly. Only sha256 digests of the keys
are kept; a presented key is compared with every digest in constant time (``hmac.compare_digest``).

The keys file is the one source that changes while the server runs: it is checked for a new
modification time, size or inode at most every ``reload_interval_s`` seconds (on the request that
finds the interval passed), so a removed key, and every token minted for it, stops working and a
new key starts working without a restart. The environment of a running process cannot change.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request

from twinkle._logging import get_logger
from twinkle.env import environ as process_environ
from twinkle.server.state.paths import tenant_id_for_key
from twinkle.server.web.errors import BadRequest, Unauthorized
from twinkle.server.web.signing import looks_like_jwt

logger = get_logger(__name__)

DEFAULT_ENV_VAR = "TWINKLE_SERVER_API_KEYS"
ANONYMOUS_TENANT = "anonymous"
TINKER_KEY_PREFIX = "tml-"
PUBLIC_PATHS = frozenset({"/healthz", "/api/v1/healthz", "/health"})
MISSING_KEY = "missing API key: send Authorization: Bearer <key> or X-API-Key"
INVALID_KEY = "invalid API key"
INVALID_TOKEN_CHALLENGE = 'Bearer error="invalid_token"'
CONFLICTING = "conflicting credentials"


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


def _file_signature(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size, info.st_ino


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
        keys_file: A file of keys, one per line; re-read when it changes (see the module doc).
        env_var: Environment variable with comma-separated keys.
        allow_anonymous: With no key configured, serve everyone as tenant ``anonymous`` instead of
            refusing to start. Ignored when keys are configured; a keys file emptied later
            refuses everyone rather than turning anonymous.
        environ: The environment to read ``env_var`` from (default: this process's).
        digests: Hex sha256 digests of further keys (``auth.api_key_sha256``).
        tokens: Verifies presented JWTs (``verify_jwt(token) -> claims``, raising ``ValueError``);
            without it only keys are accepted.
        file_digests: Hex digests of the keys file's keys as ``launch`` read them
            (``auth.api_keys_file_sha256``): used while ``keys_file`` cannot be read here (a
            replica on a node without the file), replaced as soon as it can.
        reload_interval_s: Check ``keys_file`` for changes at most this often; 0: never.
        clock: Monotonic seconds (tests pass a fake one).

    Raises:
        AuthConfigError: No key configured and ``allow_anonymous`` is false, or the keys file
            cannot be read and no ``file_digests`` stand in for it.
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
        file_digests: Iterable[str] = (),
        reload_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        environ = process_environ() if environ is None else environ
        collected = [k.strip() for k in keys]
        collected += [k.strip() for k in environ.get(env_var, "").split(",")]
        # key digest -> (tenant id, hint); the raw keys are not kept.
        self._static = _identities(collected, digests)
        self._file = Path(keys_file).expanduser() if keys_file else None
        self._file_signature: tuple[int, int, int] | None = None
        self._file_keys: dict[bytes, tuple[str, str]] = {}
        self._reload_interval_s, self._clock = reload_interval_s, clock
        self._next_check = clock() + reload_interval_s
        self._reload_lock = threading.Lock()
        self._tokens = tokens
        if self._file is not None:
            fallback = _identities((), file_digests)
            try:
                self._load_file()
            except AuthConfigError as exc:
                if not fallback:
                    raise
                self._file_keys = fallback
                logger.warning(
                    "%s; using the %d key digests launch read from it until it can be read here",
                    exc,
                    len(fallback),
                )
        self._publish()
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

    def _load_file(self) -> None:
        try:
            signature = _file_signature(self._file)
        except OSError as exc:
            raise AuthConfigError(f"cannot read API keys file {self._file}: {exc}") from exc
        self._file_keys = _identities(read_keys_file(self._file), ())
        self._file_signature = signature

    def _publish(self) -> None:
        keys = {**self._file_keys, **self._static}
        # A token names a tenant; it is accepted only while one of the tenant's keys still is.
        # One tuple, swapped in one assignment: a concurrent request sees the old or new table.
        self._table = (keys, {tenant: hint for tenant, hint in keys.values()})

    @property
    def _keys(self) -> dict[bytes, tuple[str, str]]:
        return self._table[0]

    def reload(self) -> bool:
        """Re-read the keys file now if it changed; returns whether the accepted keys changed.

        A file that cannot be read (mid-replace, deleted) leaves the current keys in force and
        logs a warning; replace the file atomically (write a temp file, rename it over).
        """
        if self._file is None:
            return False
        with self._reload_lock:
            try:
                if _file_signature(self._file) == self._file_signature:
                    return False
                before = set(self._keys)
                self._load_file()
            except (OSError, AuthConfigError) as exc:
                logger.warning("API keys file not reloaded, current keys stay: %s", exc)
                return False
            self._publish()
            changed = set(self._keys) != before
        if changed:
            logger.info("API keys file %s reloaded: %d keys accepted", self._file, len(self._keys))
        return changed

    def _maybe_reload(self) -> None:
        if self._file is None or self._reload_interval_s <= 0:
            return
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self._reload_interval_s
        self.reload()

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
        """The principal of a request, from ``X-API-Key`` and/or ``Authorization: Bearer``.

        A key sent as ``tml-<key>`` (the Tinker SDK's format) matches ``tml-<key>`` or ``<key>``.
        A request may carry both headers (the Tinker SDK sends its token as ``X-API-Key`` beside
        the key as bearer): each is checked, and they must name the same tenant.

        Raises:
            BadRequest: One header repeated with different values.
            AuthError: 401, a credential is missing or not valid, or the two headers name
                different tenants.
        """
        if self.anonymous:
            return Principal(tenant_id=ANONYMOUS_TENANT, key_hint="anonymous")
        self._maybe_reload()
        credentials = _presented_credentials(headers)
        if not credentials:
            raise AuthError(401, MISSING_KEY)
        # X-API-Key first: an expired token there answers ``invalid_token``, which the SDK needs.
        principals = [self._principal(key) for key in credentials]
        if len({p.tenant_id for p in principals}) > 1:
            raise AuthError(
                401,
                f"{CONFLICTING}: X-API-Key and Authorization name different tenants; send one key",
            )
        return principals[0]

    def _principal(self, key: str) -> Principal:
        # After its first call the Tinker SDK presents a token on every request: no key digest
        # to compute and compare for those (a key never has a JWT's shape).
        if self._tokens is not None and looks_like_jwt(key):
            return self._token_principal(key)
        identity = self._match(key)
        if identity is None and key.startswith(TINKER_KEY_PREFIX):
            identity = self._match(key[len(TINKER_KEY_PREFIX) :])
        if identity is None:
            raise AuthError(401, INVALID_KEY)
        return Principal(tenant_id=identity[0], key_hint=identity[1])

    def _token_principal(self, token: str) -> Principal:
        try:
            tenant = self._tokens.verify_jwt(token)["org_id"]
        except ValueError as exc:
            raise AuthError(401, f"invalid token: {exc}", INVALID_TOKEN_CHALLENGE) from None
        hint = self._table[1].get(tenant)
        if hint is None:
            raise AuthError(
                401, "invalid token: its API key is no longer accepted", INVALID_TOKEN_CHALLENGE
            )
        return Principal(tenant_id=tenant, key_hint=f"token{hint}")


def _identities(keys: Iterable[str], digests: Iterable[str]) -> dict[bytes, tuple[str, str]]:
    identities = {_digest(k): (tenant_id_for_key(k), _hint(k)) for k in keys if k}
    # Digests handed over by the launcher: the tenant id is the digest's first 16 hex digits,
    # as tenant_id_for_key computes it from the raw key.
    for hexdigest in digests:
        identities.setdefault(bytes.fromhex(hexdigest), (hexdigest[:16], f"#{hexdigest[:6]}"))
    return identities


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents (``X-API-Key``, else ``Authorization: Bearer``), as sent.

    Only for the caller's own use within the request (the hub token rule of
    :mod:`twinkle.server.hub`); never store or log it.
    """
    return _presented_key(headers)


def caller_key(headers: Mapping[str, str], signer: Any = None) -> str | None:
    """The caller's API key: the presented one, or the one sealed in a presented token of ours.

    Only for the caller's own use within the request (the hub token rule); never store or log it.
    """
    key = _presented_key(headers)
    if key and signer is not None and looks_like_jwt(key):
        return signer.sealed_key(key)
    return key


def _presented_key(headers: Mapping[str, str]) -> str | None:
    credentials = _presented_credentials(headers)
    return credentials[0] if credentials else None


def _presented_credentials(headers: Mapping[str, str]) -> list[str]:
    """The request's ``X-API-Key`` and bearer credentials, in that order, each at most once.

    Every occurrence of a header counts (``items()`` of Starlette's headers lists repeats): a
    header sent twice with different values is refused, never resolved to the first or last.
    An ``Authorization`` header of another scheme is not a credential of this server.

    Raises:
        BadRequest: A header repeated with different values.
    """
    api_keys: set[str] = set()
    bearers: set[str] = set()
    for name, value in headers.items():
        name, value = str(name).lower(), str(value).strip()
        if name == "x-api-key" and value:
            api_keys.add(value)
        elif name == "authorization":
            scheme, _, credential = value.partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                bearers.add(credential.strip())
    for header, values in (("X-API-Key", api_keys), ("Authorization", bearers)):
        if len(values) > 1:
            raise BadRequest(
                f"{CONFLICTING}: {len(values)} different {header} values; send one key"
            )
    return [*api_keys, *bearers]


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
