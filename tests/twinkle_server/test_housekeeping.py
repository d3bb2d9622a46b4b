"""The gateway's housekeeping round: session expiry (never right after a restart), checkpoint
TTLs, the sweep of a finished session's sampler snapshots (records and files), futures purge;
and the one-process server (`twinkle-server launch --local`) runs it as the replicas do."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twinkle.server.gateway.app import expire_sessions, housekeep_once  # noqa: E402
from twinkle.server.state.records import EPHEMERAL_PREFIX  # noqa: E402
from twinkle.server.testing import local_server  # noqa: E402

TIMEOUT = 60.0  # heartbeat_timeout_s default


def _server_at(tmp_path, offset: float):
    """An in-process server whose state clock reads ``offset`` seconds after its start."""
    server = local_server(tmp_path, backend="mock")
    ctx = server.context
    now = [ctx.started_at + offset]
    ctx.state.clock = lambda: now[0]
    return server, ctx, now


def test_a_restarted_server_gives_every_session_a_full_timeout_before_expiring_it(tmp_path):
    server, ctx, now = _server_at(tmp_path, 0.0)
    # Its last heartbeat was long ago: the server was down (killed, restarted) meanwhile.
    silent = ctx.state.create_session("alice")
    ctx.state._modify(
        "session/" + silent.session_id,
        type(silent),
        "alice",
        "session",
        lambda s: s.model_copy(update={"last_heartbeat": now[0] - 10 * TIMEOUT}),
    )
    now[0] = ctx.started_at + TIMEOUT / 2
    assert asyncio.run(expire_sessions(ctx, server.backends)) == []
    assert not ctx.state.get_session("alice", silent.session_id).finished
    # A full timeout after the start, a session still silent is expired.
    now[0] = ctx.started_at + TIMEOUT + 1
    assert asyncio.run(expire_sessions(ctx, server.backends)) == [silent.session_id]
    assert ctx.state.get_session("alice", silent.session_id).finished


def test_one_round_sweeps_a_finished_sessions_snapshots_with_their_files(tmp_path):
    server, ctx, now = _server_at(tmp_path, 0.0)
    session = ctx.state.create_session("alice")
    run = ctx.state.create_run("alice", session.session_id, "tiny/qwen3", lora_rank=4)
    dirs = {}
    for name in (EPHEMERAL_PREFIX + "a1", "kept"):
        folder = tmp_path / "storage" / name
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"x" * 64)
        ctx.state.add_checkpoint(
            "alice",
            run.training_run_id,
            "sampler_weights",
            name,
            str(folder),
            ttl_seconds=86400 if name != "kept" else None,
        )
        dirs[name] = folder
    old = ctx.state.create_future("alice", "optim_step", run.training_run_id)
    ctx.state.complete_future("alice", old.request_id, result={})
    asyncio.run(housekeep_once(ctx, server.backends))
    assert all(folder.exists() for folder in dirs.values())  # the session is alive
    ctx.state.finish_session("alice", session.session_id)
    now[0] += ctx.server_args.future_ttl_s + 1
    asyncio.run(housekeep_once(ctx, server.backends))
    names = [c.name for c in ctx.state.list_checkpoints("alice", run.training_run_id)]
    assert names == ["kept"] and dirs["kept"].exists()
    assert not dirs[EPHEMERAL_PREFIX + "a1"].exists()
    assert ctx.state.store.get("future/" + old.request_id) is None


def test_the_one_process_server_runs_housekeeping_and_the_model_sweep(tmp_path, monkeypatch):
    """``serve_local`` starts the same background work as the Serve replicas (it ran none:
    sessions never expired, TTLs never passed, futures piled up in a local server)."""
    import twinkle.server.gateway.app as gateway_app
    import twinkle.server.model.deployment as model_deployment
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import maintain_forever
    from twinkle.server.testing import config_dict

    started: list[str] = []

    async def fake_housekeeping(ctx, backends, interval_s=10.0):
        started.append("housekeeping")

    async def fake_sweep(service, interval_s):
        started.append(f"sweep {interval_s}")

    monkeypatch.setattr(gateway_app, "housekeeping_forever", fake_housekeeping)
    monkeypatch.setattr(model_deployment, "sweep_forever", fake_sweep)
    config = config_dict(backend="mock")
    config["storage"] = {"root": str(tmp_path / "storage")}
    config = parse_config(config)
    server = local_server(tmp_path, backend="mock")
    asyncio.run(maintain_forever(server, config))
    assert sorted(started) == ["housekeeping", "sweep 30.0"]


def test_housekeeping_clears_a_killed_saves_leftovers_every_sweep_period(tmp_path):
    """What a save killed mid-write leaves in the storage (a stale staging copy, a previous
    checkpoint moved aside) is cleared by housekeeping, at most once per PARTIAL_SWEEP_EVERY_S."""
    import os
    import time

    from twinkle.model.checkpoint import PARTIAL_SAVE_AGE_S
    from twinkle.server.gateway import app

    server, ctx, _ = _server_at(tmp_path, 0.0)
    runs = ctx.storage_root / "alice" / "run-1"
    checkpoint = runs / "step-1"
    checkpoint.mkdir(parents=True)
    staging = runs / ".step-2.tmp-0badc0de"
    staging.mkdir()
    (staging / "adapter_model.safetensors").write_bytes(b"x")
    stale = time.time() - PARTIAL_SAVE_AGE_S - 1
    os.utime(staging, (stale, stale))
    asyncio.run(housekeep_once(ctx, server.backends))
    assert not staging.exists() and checkpoint.exists()
    moved_aside = runs / ".step-1.old-0badc0de"
    moved_aside.mkdir()
    asyncio.run(housekeep_once(ctx, server.backends))  # within the period: not walked again
    assert moved_aside.exists()
    ctx.partial_sweep_at -= app.PARTIAL_SWEEP_EVERY_S
    asyncio.run(housekeep_once(ctx, server.backends))
    assert not moved_aside.exists() and checkpoint.exists()
