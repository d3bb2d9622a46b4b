"""Tinker ``AdminClient`` calls, each scoped to the caller's own key, and ``auth/token``.

- ``audit``: the caller's own audit events (:class:`~twinkle.server.state._activity.ActivityMixin`
  records them);
- ``billing/usage/events``: the caller's hourly tokens trained, prompted and sampled, and its
  checkpoint saves. Twinkle bills nothing: every cost and rate is ``0.0``, in Tinker's shape;
- ``billing/usage/checkpoints/current``: the bytes the caller's checkpoints hold now, per project;
- ``auth/token``: a short-lived HS256 JWT naming the caller, minted for an API key (never for
  another token, so a stolen token dies with its hour). The client config turns
  ``pjwt_auth_enabled`` on, so the SDK exchanges its key for one, presents it instead of the key and
  reads ``whoami`` from its claims;
- ``auth/apikey/me``: GET describes the presented key (``tinker auth login`` checks a key with it);
  DELETE is refused with 403: keys are the server's configuration, not the caller's to delete.
"""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime, timedelta, timezone
from typing import Any

from pydantic import TypeAdapter, ValidationError

from twinkle.server.tinker.api import TinkerApi
from twinkle.server.tinker.sessions import DEFAULT_PROJECT, owner_urn
from twinkle.server.web.errors import BadRequest, Forbidden, Unauthorized
from twinkle.server.web.signing import JWT_TTL_S, looks_like_jwt

AUDIT_TYPES = {"all": "", "checkpoints": "checkpoint_", "projects": "project_"}
EMPTY_AUDIT_TYPES = ("teams", "organizations")  # no teams or organisations in Twinkle
GIGABYTE = 1e9


def audit_log(api: TinkerApi, owner: str, event_type: str, day: str | None) -> dict:
    """The caller's audit events of ``event_type``, on ``day`` (ISO date) or all."""
    if event_type not in AUDIT_TYPES and event_type not in EMPTY_AUDIT_TYPES:
        raise BadRequest(f"unknown event_type {event_type!r}")
    start = end = None
    if day is not None:
        start = datetime.combine(_parse(date, day, "day"), datetime.min.time(), timezone.utc)
        start, end = start.timestamp(), (start + timedelta(days=1)).timestamp()
    prefix = AUDIT_TYPES.get(event_type)
    events = [] if prefix is None else api.state.list_events(owner, start, end)
    return {"entries": [_entry(owner, e) for e in events if e.event.startswith(prefix or "")]}


def billing_usage(api: TinkerApi, owner: str, starting_on: str, ending_before: str) -> dict:
    """The caller's hourly token and checkpoint-save events in ``[starting_on, ending_before)``."""
    start = _parse(datetime, starting_on, "starting_on").timestamp()
    end = _parse(datetime, ending_before, "ending_before").timestamp()
    if end <= start:
        raise BadRequest("ending_before must be after starting_on")
    state = api.state
    data = [_token_event(owner, b) for b in state.usage_buckets(owner, start, end)]
    saves = Counter(
        (int(e.timestamp // 3600) * 3600, e.event_details.get("model_id"))
        for e in state.list_events(owner, start, end)
        if e.event == "checkpoint_create"
    )
    data += [_checkpoint_event(owner, h, run, n) for (h, run), n in sorted(saves.items())]
    for event in data:
        event["project_id"] = _project(api, owner, event["session_id"])
    sessions = {
        e["session_id"]: {"user_metadata": _metadata(api, owner, e["session_id"])}
        for e in data
        if e["session_id"]
    }
    data.sort(key=lambda e: (e["bucket_start"], -e["event_info"].get("token_count", 0)))
    return {"data": data, "sessions": sessions, "cost_data_through": None}


def checkpoint_storage(api: TinkerApi, owner: str, project_id: str | None) -> dict:
    """The bytes the caller's checkpoints hold now, per project (or of ``project_id``)."""
    runs = {r.training_run_id: r for r in api.state.list_runs(owner, limit=1 << 30)[0]}
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for ckpt in api.state.checkpoints_of(owner):
        run = runs.get(ckpt.training_run_id)
        project = _project(api, owner, run.session_id if run else None)
        count[project] += 1
        size[project] += ckpt.size_bytes or 0
    return {
        "effective_rate_usd_per_gigabyte_month": 0.0,
        "data": [
            {
                "project_id": project,
                "org_user_urn": owner_urn(owner),
                "checkpoint_count": count[project],
                "size_bytes": size[project],
                "size_gigabytes": size[project] / GIGABYTE,
                "estimated_monthly_cost_usd": 0.0,
            }
            for project in sorted(count)
            if project_id is None or project == project_id
        ],
    }


def auth_token(api: TinkerApi, owner: str, key: str) -> dict:
    """A short-lived JWT for the presented API ``key`` (never for a token)."""
    if looks_like_jwt(key):
        raise Unauthorized("auth/token takes an API key, not a token")
    return {"jwt": api.ctx.signer.mint_jwt(owner, owner_urn(owner), JWT_TTL_S, key=key)}


def describe_key(owner: str) -> dict:
    """``auth/apikey/me``: the presented key, as the SDK's ``tinker auth login`` reads it."""
    return {
        "key_id": int(owner, 16) if _is_hex(owner) else 0,
        "name": f"twinkle-{owner}",
        "note": "an API key from this Twinkle server's configuration",
        "details": {
            "org_details": {"name": owner},
            "user_details": {"email": owner_urn(owner)},
        },
    }


def delete_key() -> None:
    """``DELETE auth/apikey/me``: refused, keys are the server's configuration, not the caller's."""
    raise Forbidden(
        "API keys are set by the server's configuration (auth.api_keys, auth.api_keys_file, "
        "TWINKLE_SERVER_API_KEYS); ask the operator to remove this key"
    )


def count_sample_usage(
    state: Any,
    owner: str,
    base_model: str,
    sampling_session_id: str | None,
    prompt: list[int],
    sequences: list[dict],
) -> None:
    """Count one ``asample``'s prompt tokens and sampled tokens (in memory; see ActivityMixin)."""
    session_id = None
    if sampling_session_id and ":sample:" in sampling_session_id:
        session_id = sampling_session_id.split(":sample:")[0]
    sampled = sum(len(seq.get("tokens") or []) for seq in sequences)
    state.count_usage(owner, "sampling_prefill", len(prompt), base_model, session_id)
    state.count_usage(owner, "sampling_sample", sampled, base_model, session_id)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def _entry(owner: str, event: Any) -> dict[str, Any]:
    details = {"actor": owner_urn(owner), **event.event_details}
    checkpoint = event.event.startswith("checkpoint_")
    return {
        "timestamp": datetime.fromtimestamp(event.timestamp, timezone.utc).isoformat(),
        "event": event.event,
        "event_details": details,
        "model_id": details.get("model_id") if checkpoint else None,
        "tinker_path": details.get("tinker_path") if checkpoint else None,
    }


def _token_event(owner: str, bucket: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"type": bucket.kind, "token_count": bucket.token_count}
    if bucket.kind == "sampling_prefill":
        info["cached"] = False
    return {
        **_envelope(owner, bucket.bucket_start, bucket.base_model, bucket.session_id),
        "estimated_cost_usd": 0.0,
        "effective_rate_usd_per_million_tokens": 0.0,
        "event_info": info,
    }


def _checkpoint_event(owner: str, hour: int, run_id: str | None, n: int) -> dict[str, Any]:
    session = run_id.split(":train:")[0] if run_id and ":train:" in run_id else None
    return {
        **_envelope(owner, hour, None, session),
        "event_info": {"type": "checkpoint", "count": n},
    }


def _envelope(owner: str, hour: int, base_model: str | None, session: str | None) -> dict:
    start = datetime.fromtimestamp(hour, timezone.utc)
    return {
        "bucket_start": start.isoformat(),
        "bucket_end": (start + timedelta(hours=1)).isoformat(),
        "base_model": base_model,
        "user_id": owner_urn(owner),
        "session_id": session,
    }


def _project(api: TinkerApi, owner: str, session_id: str | None) -> str:
    if not session_id:
        return DEFAULT_PROJECT
    return api.state.session_info(owner, session_id).project_id or DEFAULT_PROJECT


def _metadata(api: TinkerApi, owner: str, session_id: str) -> dict[str, str] | None:
    try:
        values = api.state.get_session(owner, session_id).user_metadata
    except Exception:  # noqa: BLE001 - a session deleted since: no metadata
        return None
    return {str(k): str(v) for k, v in values.items()} if values else None


def _parse(kind: type, value: str, name: str) -> Any:
    try:
        parsed = TypeAdapter(kind).validate_python(value)
    except ValidationError:
        raise BadRequest(f"{name} must be an ISO 8601 {kind.__name__}, got {value!r}") from None
    if isinstance(parsed, datetime) and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed
