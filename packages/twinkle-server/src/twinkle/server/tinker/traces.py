"""Session trace export (``RestClient.export_session_trace``).

The trace is built when it is downloaded, from the session's futures (one slice per request,
from submission to completion, one track per model or sampler), in the Chrome trace-event JSON
format that https://ui.perfetto.dev opens. The download URL carries a signed, expiring token
instead of a key (the SDK downloads it with a plain GET), signed by :mod:`twinkle.server.web.signing`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request

from twinkle.server.state.records import FutureRecord
from twinkle.server.web.errors import NotFound
from twinkle.server.web.signing import Signer

URL_TTL_S = 3600


def signed_url(signer: Signer, request: Request, owner: str, session_id: str) -> str:
    token = signer.sign(f"{owner}|{session_id}|{int(time.time()) + URL_TTL_S}")
    return str(request.url_for("trace_download", token=token))


def verify(signer: Signer, token: str) -> tuple[str, str]:
    """(owner, session id) of a valid, unexpired token; NotFound otherwise (nothing leaks)."""
    payload = signer.unsign(token)
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
