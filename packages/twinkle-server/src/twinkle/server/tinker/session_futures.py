"""Retrieving Tinker futures: ``retrieve_future`` (one future's result, long-polled) and
``retrieve_futures``, the SDK's batch long-poll of one sampling session's finished samples.

With ``sample_use_retrieve_futures`` in the client config, each ``SamplingClient`` runs one poller
per (sampling session, cloned sampler) instead of one ``retrieve_future`` long-poll per sample; a
completion it reports is then fetched once with ``retrieve_future``.

Sample futures carry their target as ``model_id`` (:func:`sample_target`). The cursor is the
latest completion time (microseconds) the poller has seen: a completion is reported once, when it
is newer than the poller's ``prev_cursor``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from tinker import types

from twinkle.server.process.threads import off_loop
from twinkle.server.state._futures import ORPHANED
from twinkle.server.state.records import FutureRecord
from twinkle.server.tinker import wire_json
from twinkle.server.tinker.api import LONG_POLL_S, TinkerApi
from twinkle.server.tinker.futures import PROTOBUF
from twinkle.server.web.errors import BadRequest, Gone

CLONE_BLOCK = 1_000_000_000  # the SDK's seq_id block per cloned SamplingClient
RESCAN_S = 1.0  # completions on other replicas are seen within this


def sample_target(sampling_session_id: Any, seq_id: Any) -> str | None:
    """The ``model_id`` a sample future of (sampling session, cloned sampler) is filed under."""
    if not isinstance(sampling_session_id, str) or not sampling_session_id:
        return None
    clone = seq_id // CLONE_BLOCK if isinstance(seq_id, int) else 0
    return sampling_session_id if clone == 0 else f"{sampling_session_id}:clone:{clone}"


async def retrieve_future(
    api: TinkerApi, owner: str, body: types.FutureRetrieveRequest, wants_protobuf: bool
) -> dict[str, Any] | bytes:
    """One future's result after a long poll: JSON, protobuf bytes (``wants_protobuf``; else the
    JSON an SDK before 0.27 reads), ``try_again`` while pending, or its error.

    Raises:
        Gone: A sample whose gateway process stopped: the SDK resubmits it.
    """
    rid = body.request_id
    record = await api.futures.wait(owner, rid, LONG_POLL_S)
    if record.status == "pending":
        return {"type": "try_again", "request_id": rid, "queue_state": record.queue_state}
    if record.status == "error":
        if record.kind == "sample" and record.error.message == ORPHANED:
            # A sample changes no state, so running it again is safe: the SDK's sampling
            # client answers a 410 on its future by resubmitting the request itself
            # (tinker.lib.api_future_impl: RetryableException, retried by RetryHandler).
            raise Gone(f"sample {rid}: {ORPHANED}")
        return {"error": record.error.message, "category": record.error.category}
    if record.content_type == PROTOBUF:
        data = base64.b64decode(record.result_b64 or "")
        if not wants_protobuf:
            return await off_loop(wire_json.result_as_json, record.kind, data)
        return data
    return record.result


async def retrieve_futures(
    api: TinkerApi, owner: str, body: types.FuturesRetrieveRequest
) -> dict[str, Any]:
    """The completions of one sampling session's samples newer than ``prev_cursor``, after a
    long poll of at most ``timeout`` seconds."""
    sid, prev, timeout = body.target.sampling_session_id, body.prev_cursor, body.timeout
    if timeout is not None and timeout < 0:
        raise BadRequest("timeout must be a non-negative number of seconds")
    api.state.get_sampling_session(owner, sid)  # another tenant's session: 404
    model_id = sample_target(sid, body.target.cloned_sampler_id * CLONE_BLOCK)
    wait_s = LONG_POLL_S if timeout is None else min(float(timeout), LONG_POLL_S)
    done = await _wait_for_completions(api, owner, model_id, prev, wait_s)
    return {
        "completions": [_completion(f) for f in done],
        "cursor": max([prev, *(_cursor(f) for f in done)]),
    }


async def _wait_for_completions(
    api: TinkerApi, owner: str, model_id: str | None, prev: int, wait_s: float
) -> list[FutureRecord]:
    deadline = time.monotonic() + wait_s
    while True:
        futures = [
            api.futures.settle(owner, f)
            for f in api.state._all("future/", FutureRecord, owner)
            if f.model_id == model_id
        ]
        done = [f for f in futures if f.status != "pending" and _cursor(f) > prev]
        left = deadline - time.monotonic()
        if done or left <= 0:
            return sorted(done, key=_cursor)
        # Futures this replica runs wake the poll the moment they finish; others on the rescan.
        local = api.futures._done
        waits = [
            asyncio.ensure_future(local[f.request_id].wait())
            for f in futures
            if f.request_id in local
        ]
        if not waits:
            await asyncio.sleep(min(RESCAN_S, left))
            continue
        try:
            await asyncio.wait(
                waits, timeout=min(RESCAN_S, left), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()


def _cursor(record: FutureRecord) -> int:
    return int((record.finished_at or 0.0) * 1e6)


def _completion(record: FutureRecord) -> dict[str, Any]:
    if record.status == "error":
        return {"state": "failed", "request_id": record.request_id}
    if record.result_b64 is not None:
        size = len(base64.b64decode(record.result_b64))
    else:
        size = len(json.dumps(record.result).encode())
    return {
        "state": "finished",
        "request_id": record.request_id,
        "response_payload_uncompressed_size": size,
    }
