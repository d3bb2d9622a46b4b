"""Session trace export (``RestClient.export_session_trace``) and the server's signing secret.

The trace is built when it is downloaded, from the session's futures (one slice per request,
from submission to completion, one track per model or sampler), in the Chrome trace-event JSON
format that https://ui.perfetto.dev opens. The download URL carries a signed, expiring token
instead of a key (the SDK downloads it with a plain GET); the auth-token JWTs use the same secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import Any

from fastapi import Request

from twinkle.server.errors import NotFound
from twinkle.server.state.records import FutureRecord

URL_TTL_S = 3600
SECRET_KEY = "secret/signing"


def signing_secret(state: Any) -> bytes:
    """The server's random signing secret, created once in the shared store (every replica and
    every restart with a persistent store signs with the same one)."""
    raw = state.store.update(
        SECRET_KEY, lambda current: current or {"owner": "", "hex": secrets.token_hex(32)}
    )
    return bytes.fromhex(raw["hex"])


def mac(state: Any, data: str) -> str:
    """The URL-safe HMAC-SHA256 of ``data`` under the server's secret."""
    return b64url(hmac.new(signing_secret(state), data.encode(), hashlib.sha256).digest())


def sign(state: Any, payload: str) -> str:
    return b64url(payload.encode()) + "." + mac(state, payload)


def unsign(state: Any, token: str) -> str | None:
    """The signed payload, or None when the token is malformed or its signature is wrong."""
    try:
        body, signature = token.split(".")
        payload = unb64url(body).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if hmac.compare_digest(mac(state, payload), signature) else None


def signed_url(state: Any, request: Request, owner: str, session_id: str) -> str:
    token = sign(state, f"{owner}|{session_id}|{int(time.time()) + URL_TTL_S}")
    return str(request.url_for("trace_download", token=token))


def verify(state: Any, token: str) -> tuple[str, str]:
    """(owner, session id) of a valid, unexpired token; NotFound otherwise (nothing leaks)."""
    payload = unsign(state, token)
    parts = payload.split("|") if payload else []
    if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < time.time():
        raise NotFound("trace export not found or expired")
    return parts[0], parts[1]


def build(state: Any, owner: str, session_id: str) -> dict[str, Any]:
    """The Chrome trace-event JSON of ``owner``'s session."""
    session = state.get_session(owner, session_id)
    prefix = f"{session_id}:"
    futures = [
        f
        for f in state._all("future/", FutureRecord, owner)
        if f.model_id and f.model_id.startswith(prefix)
    ]
    tracks = {m: i + 1 for i, m in enumerate(sorted({f.model_id for f in futures}))}
    events: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": model}}
        for model, tid in tracks.items()
    ]
    for f in sorted(futures, key=lambda f: f.created_at):
        end = f.finished_at if f.finished_at is not None else state.clock()
        events.append(
            {
                "name": f.kind,
                "ph": "X",
                "pid": 1,
                "tid": tracks[f.model_id],
                "ts": round((f.created_at - session.created_at) * 1e6),
                "dur": max(0, round((end - f.created_at) * 1e6)),
                "args": {"request_id": f.request_id, "status": f.status},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"session": session_id}}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
