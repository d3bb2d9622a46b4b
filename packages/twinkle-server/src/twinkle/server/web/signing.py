"""The server's signing secret, and what is signed with it: expiring URLs and the auth-token JWTs.

One random 32-byte secret lives in the shared store (created by whichever replica needs it first),
so every replica, and every restart with a persistent store, signs and verifies with the same one.
A process reads it once. The JWTs are HS256 tokens naming the tenant (``sub``, ``org_id``) that the
Tinker SDK obtains from ``auth/token`` and then presents instead of its API key; the key check in
:mod:`twinkle.server.web.auth` verifies them with :meth:`Signer.verify_jwt`.

A token also carries the key it was minted for, sealed (AES-256-GCM under a key derived from the
secret, so only this server can read it): publishing to the hub with the caller's own key (the
seed's "a ModelScope token as the api_key", :mod:`twinkle.server.hub`) needs the raw key, which a
client presenting tokens no longer sends. The server stores neither.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SECRET_KEY = "secret/signing"
JWT_TTL_S = 3600
JWT_ISSUER = "twinkle"
_JWT_HEADER = {"alg": "HS256", "typ": "JWT"}


class TokenInvalid(ValueError):
    """A presented JWT is malformed, not signed by this server, or expired."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def looks_like_jwt(credential: str) -> bool:
    """Whether a presented credential has a JWT's shape (a JSON header, three parts)."""
    return credential.startswith("eyJ") and credential.count(".") == 2


class Signer:
    """HMAC-SHA256 under the server's secret in ``state``'s store.

    Args:
        state: The :class:`~twinkle.server.state.ServerState` whose store holds the secret.
    """

    def __init__(self, state: Any) -> None:
        self.state = state
        self._secret: bytes | None = None

    def secret(self) -> bytes:
        if self._secret is None:
            raw = self.state.store.update(
                SECRET_KEY, lambda current: current or {"owner": "", "hex": secrets.token_hex(32)}
            )
            self._secret = bytes.fromhex(raw["hex"])
        return self._secret

    def mac(self, data: str) -> str:
        """The URL-safe HMAC-SHA256 of ``data``."""
        return b64url(hmac.new(self.secret(), data.encode(), hashlib.sha256).digest())

    def check(self, data: str, signature: str) -> bool:
        """Whether ``signature`` is this server's MAC of ``data``. Before anything was ever
        signed there is no secret yet: the answer is no, and none is created, so that a refused
        token or URL leaves the state as it was."""
        if self._secret is None and self.state.store.get(SECRET_KEY) is None:
            return False
        try:  # bytes: compare_digest refuses non-ASCII strings with a TypeError
            given = signature.encode("utf-8")
        except (AttributeError, UnicodeEncodeError):
            return False
        return hmac.compare_digest(self.mac(data).encode(), given)

    def sign(self, payload: str) -> str:
        return b64url(payload.encode()) + "." + self.mac(payload)

    def unsign(self, token: str) -> str | None:
        """The signed payload, or None when the token is malformed or its signature is wrong."""
        try:
            body, signature = token.split(".")
            payload = unb64url(body).decode()
        except (ValueError, UnicodeDecodeError, binascii.Error):
            return None
        return payload if self.check(payload, signature) else None

    def _sealing(self) -> AESGCM:
        # A key of its own for sealing (never the MAC key itself), derived from the secret.
        return AESGCM(hmac.new(self.secret(), b"twinkle/seal-key", hashlib.sha256).digest())

    def mint_jwt(
        self, tenant_id: str, subject: str, ttl_s: int = JWT_TTL_S, key: str | None = None
    ) -> str:
        """An HS256 JWT for ``tenant_id`` with the claims the SDK's ``whoami`` reads, and ``key``
        (the API key it is minted for) sealed in claim ``key``."""
        now = int(time.time())
        claims = {
            "sub": subject,
            "org_id": tenant_id,
            "iss": JWT_ISSUER,
            "iat": now,
            "exp": now + ttl_s,
        }
        if key is not None:
            nonce = os.urandom(12)
            sealed = self._sealing().encrypt(nonce, key.encode(), tenant_id.encode())
            claims["key"] = b64url(nonce + sealed)
        head = b64url(json.dumps(_JWT_HEADER).encode())
        body = b64url(json.dumps(claims).encode())
        return f"{head}.{body}.{self.mac(f'{head}.{body}')}"

    def verify_jwt(self, token: str, now: float | None = None) -> dict[str, Any]:
        """The claims of a JWT this server signed that has not expired.

        Raises:
            TokenInvalid: The token is malformed, signed otherwise (or with another algorithm),
                or expired.
        """
        try:
            head, body, signature = token.split(".")
            header = json.loads(unb64url(head))
            claims = json.loads(unb64url(body))
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise TokenInvalid("malformed token") from None
        if header != _JWT_HEADER or not isinstance(claims, dict):
            raise TokenInvalid("token not issued by this server")
        if not self.check(f"{head}.{body}", signature):
            raise TokenInvalid("token signature is not valid")
        expires = claims.get("exp")
        if not isinstance(expires, (int, float)) or expires <= (
            time.time() if now is None else now
        ):
            raise TokenInvalid("token expired")
        if not isinstance(claims.get("org_id"), str) or claims.get("iss") != JWT_ISSUER:
            raise TokenInvalid("token not issued by this server")
        return claims

    def sealed_key(self, token: str) -> str | None:
        """The API key sealed in a valid token of this server, or None (no key, or not valid)."""
        try:
            claims = self.verify_jwt(token)
            raw = unb64url(claims["key"])
            return self._sealing().decrypt(raw[:12], raw[12:], claims["org_id"].encode()).decode()
        except (TokenInvalid, KeyError, TypeError, ValueError, InvalidTag):
            return None
