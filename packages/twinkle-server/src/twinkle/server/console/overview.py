"""What the console shows that no other route answers, as plain functions over the state.

A tenant's functions take its tenant id and read only its own records; :func:`operator_view`
reads every tenant's, and its route answers admin keys only.
"""

from __future__ import annotations

from typing import Any

from twinkle.server.state._futures import FUTURE
from twinkle.server.state._sessions import RUN, SESSION
from twinkle.server.state.records import FutureRecord, SessionRecord, TrainingRunRecord


def _records(state: Any, prefix: str, model: type) -> list:
    return [model.model_validate(raw) for _, raw in state.store.scan(prefix)]


def sessions_of(state: Any, owner: str) -> list[dict[str, Any]]:
    """``owner``'s sessions, newest first, each with the runs it created."""
    runs, _ = state.list_runs(owner, limit=1 << 30)
    by_session: dict[str, list[str]] = {}
    for run in runs:
        by_session.setdefault(run.session_id, []).append(run.training_run_id)
    sessions = sorted(
        state.list_sessions(owner, include_finished=True),
        key=lambda s: (s.created_at, s.session_id),
        reverse=True,
    )
    return [
        {
            "session_id": s.session_id,
            "created_at": s.created_at,
            "last_heartbeat": s.last_heartbeat,
            "finished": s.finished,
            "tags": s.tags,
            "sdk_version": s.sdk_version,
            "training_run_ids": by_session.get(s.session_id, []),
        }
        for s in sessions
    ]


def _base_models(state: Any) -> dict[str, str]:
    """Every run's base model by run id (a Tinker call's future names its run as model id)."""
    return {r.training_run_id: r.base_model for r in _records(state, RUN, TrainingRunRecord)}


def pending_calls(state: Any, owner: str) -> list[dict[str, Any]]:
    """``owner``'s pending calls with their place in line: a call's line is the base model it
    runs on (its run's), ``position`` counts every tenant's pending calls in that line
    submitted before it, plus one; ``of`` is the line's length. Only counts of other tenants'
    calls are given, never their ids or runs."""
    pending = [f for f in _records(state, FUTURE, FutureRecord) if f.status == "pending"]
    bases = _base_models(state)
    lines: dict[str, list[FutureRecord]] = {}
    for future in sorted(pending, key=lambda f: (f.created_at, f.request_id)):
        line = bases.get(future.model_id or "", future.model_id or "")
        lines.setdefault(line, []).append(future)
    now = state.clock()
    calls = []
    for model, line in lines.items():
        for position, future in enumerate(line, start=1):
            if future.owner != owner:
                continue
            calls.append(
                {
                    "request_id": future.request_id,
                    "kind": future.kind,
                    "model": model,
                    "model_id": future.model_id,
                    "queue_state": future.queue_state,
                    "waiting_s": round(max(0.0, now - future.created_at), 3),
                    "position": position,
                    "of": len(line),
                }
            )
    return sorted(calls, key=lambda c: (c["model"], c["position"]))


def operator_view(state: Any) -> dict[str, Any]:
    """Every tenant's sessions, runs, loaded adapters, pending calls and steps trained."""
    sessions = _records(state, SESSION, SessionRecord)
    runs = _records(state, RUN, TrainingRunRecord)
    futures = [f for f in _records(state, FUTURE, FutureRecord) if f.status == "pending"]
    tenants: dict[str, dict[str, Any]] = {}

    def row(owner: str) -> dict[str, Any]:
        return tenants.setdefault(
            owner,
            {
                "tenant_id": owner,
                "active_sessions": 0,
                "runs": 0,
                "loaded_adapters": 0,
                "pending_calls": 0,
                "steps": 0,
                "tokens": 0,
            },
        )

    for session in sessions:
        row(session.owner)["active_sessions"] += not session.finished
    adapters = []
    for run in runs:
        entry = row(run.owner)
        entry["runs"] += 1
        if run.status != "active":
            continue
        history = state.stored_history(run.training_run_id)
        entry["steps"] += history.recorded
        entry["tokens"] += sum(p.num_tokens or 0 for p in history.points)
        if run.adapter_name:
            entry["loaded_adapters"] += 1
            adapters.append(
                {
                    "tenant_id": run.owner,
                    "training_run_id": run.training_run_id,
                    "base_model": run.base_model,
                    "adapter_name": run.adapter_name,
                    "lora_rank": run.lora_rank,
                    "last_request_time": run.last_request_time,
                }
            )
    queue: dict[str, dict[str, int]] = {}
    bases = {r.training_run_id: r.base_model for r in runs}
    for future in futures:
        row(future.owner)["pending_calls"] += 1
        line = bases.get(future.model_id or "", future.model_id or "")
        per_tenant = queue.setdefault(line, {})
        per_tenant[future.owner] = per_tenant.get(future.owner, 0) + 1
    return {
        "tenants": sorted(tenants.values(), key=lambda t: t["tenant_id"]),
        "adapters": sorted(adapters, key=lambda a: (a["tenant_id"], a["training_run_id"])),
        "pending_by_model": queue,
    }


__all__ = ["operator_view", "pending_calls", "sessions_of"]
