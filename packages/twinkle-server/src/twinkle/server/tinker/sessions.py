"""Tinker sessions and listings of ``RestClient``: sessions, their search, project, trace
export, and every checkpoint of the caller (``list_user_checkpoints``).

Tenants are isolated: "accessible" (``access_scope``, ``AccessibleSearchOwner``) means the
caller's own records, the only ones it may see; another tenant's ids answer 404.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tinker import types

from twinkle.server.gateway.routes_common import checkpoint_to_wire
from twinkle.server.state.records import SessionRecord
from twinkle.server.tinker.api import TinkerApi
from twinkle.server.web.errors import BadRequest

DEFAULT_PROJECT = "default"
CLIENT_FINISH_REASONS = ("success", "errored", "interrupted")


def owner_urn(owner: str) -> str:
    """The URN a tenant has in session summaries, audit details and ``whoami``."""
    return f"tml:user:{owner}"


def list_sessions(api: TinkerApi, owner: str, limit: int, offset: int) -> dict:
    """One page of the caller's session ids, newest first (finished ones too)."""
    found = _newest_first(api.state.list_sessions(owner, include_finished=True))
    return {"sessions": [s.session_id for s in found[offset : offset + limit]]}


def get_session(api: TinkerApi, owner: str, session_id: str) -> dict:
    """``GetSessionResponse``: the session's training runs, samplers, metadata and name."""
    state = api.state
    session = state.get_session(owner, session_id)
    info = state.session_info(owner, session_id)
    runs, _ = state.list_runs(owner, limit=1 << 30)
    return {
        "training_run_ids": [r.training_run_id for r in runs if r.session_id == session_id],
        "sampler_ids": [
            s.sampling_session_id
            for s in state.sampling_sessions_of(owner)
            if s.session_id == session_id
        ],
        "user_metadata": _str_dict(session.user_metadata),
        "display_name": info.display_name,
    }


def assign_project(api: TinkerApi, owner: str, session_id: str, project_id: Any) -> dict:
    if not isinstance(project_id, str) or not project_id:  # the SDK has no type for this body
        raise BadRequest("assign_session_project needs project_id")
    info = api.state.assign_session_project(owner, session_id, project_id)
    return {"session_id": session_id, "project_id": info.project_id}


def list_user_checkpoints(api: TinkerApi, owner: str, limit: int, offset: int) -> dict:
    """One page of every (non-ephemeral) checkpoint of the caller."""
    found = [c for c in api.state.checkpoints_of(owner) if not c.ephemeral]
    return {
        "checkpoints": [checkpoint_to_wire(c) for c in found[offset : offset + limit]],
        "cursor": {"offset": offset, "limit": limit, "total_count": len(found)},
    }


def search(api: TinkerApi, owner: str, query: types.SessionSearchRequest) -> dict:
    """One page of ``owner``'s sessions that match ``query``, newest first."""
    if isinstance(query.owner, types.UserSearchOwner) and owner_urn(owner) not in (
        query.owner.owner_urns
    ):
        return {"sessions": [], "next_cursor": None}
    summaries = [summary(api, s) for s in _newest_first(api.state.list_sessions(owner, True))]
    matches = [s for s in summaries if _matches(s, query)]
    if query.cursor is not None:
        after = (query.cursor.last_created_at, query.cursor.last_session_id)
        matches = [s for s in matches if (s["_created"], s["session_id"]) < after]
    page, more = matches[: query.limit], len(matches) > query.limit
    cursor = (
        {"last_created_at": page[-1]["created_at"], "last_session_id": page[-1]["session_id"]}
        if more and page
        else None
    )
    return {
        "sessions": [{k: v for k, v in s.items() if not k.startswith("_")} for s in page],
        "next_cursor": cursor,
    }


def summary(api: TinkerApi, session: SessionRecord) -> dict[str, Any]:
    """The Tinker ``SessionSummary`` of a session (``_created`` for sorting, dropped on the wire)."""
    state, owner = api.state, session.owner
    info = state.session_info(owner, session.session_id)
    runs = {
        r.training_run_id
        for r in state.list_runs(owner, limit=1 << 30)[0]
        if r.session_id == session.session_id
    }
    ckpts = [
        c for c in state.checkpoints_of(owner) if c.training_run_id in runs and not c.ephemeral
    ]
    created = datetime.fromtimestamp(session.created_at, timezone.utc)
    return {
        "session_id": session.session_id,
        "created_at": created.isoformat(),
        "owner": owner_urn(owner),
        "project_id": info.project_id or DEFAULT_PROJECT,
        "status": _status(session, info.finish_reason, info.finish_detail),
        "checkpoints_count": len(ckpts),
        "display_name": info.display_name,
        "user_metadata": _str_dict(session.user_metadata),
        "checkpoint_storage_bytes": sum(c.size_bytes or 0 for c in ckpts),
        "_created": created,
    }


def _status(session: SessionRecord, reason: str | None, detail: str | None) -> dict | None:
    if not session.finished:
        return {"type": "active"}
    if reason in CLIENT_FINISH_REASONS:
        return {"type": "client_finished", "reason": {"type": reason}, "detail": detail}
    return None  # expired without a word from its client: neither finished nor running


def _matches(s: dict[str, Any], q: types.SessionSearchRequest) -> bool:
    if q.session_id is not None or q.display_name is not None:
        by_id = q.session_id is not None and s["session_id"] == q.session_id
        name = (s["display_name"] or "").lower()
        by_name = q.display_name is not None and all(
            word in name for word in q.display_name.lower().split()
        )
        if not (by_id or by_name):
            return False
    if q.project_ids is not None and s["project_id"] not in q.project_ids:
        return False
    metadata = s["user_metadata"] or {}
    if any(metadata.get(k) != v for k, v in q.user_metadata.items()):
        return False
    return q.statuses is None or any(_status_matches(s["status"], st) for st in q.statuses)


def _status_matches(status: dict | None, query: Any) -> bool:
    if status is None or status["type"] != query.type:
        return False
    reasons = getattr(query, "reasons", None)
    return reasons is None or status["reason"]["type"] in reasons


def _newest_first(sessions: list[SessionRecord]) -> list[SessionRecord]:
    return sorted(sessions, key=lambda s: (s.created_at, s.session_id), reverse=True)


def _str_dict(values: dict[str, Any] | None) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in values.items()} if values else None
