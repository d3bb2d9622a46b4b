"""The gateway's route table (``GET /api/v1/routes``) comes from the config; the seed's Node-Rank
YAML, completed as ``twinkle-server check-config`` asks, is a valid config."""

from __future__ import annotations

import asyncio

import yaml
from seed_layouts import completed, seed_data

from twinkle.server.config import parse_config
from twinkle.server.gateway.route_table import route_table
from twinkle.server.process.cli import main
from twinkle.server.testing import KEYS, client

SEED_TABLE = {
    "gateway": "/api/v1",
    "models": {"Qwen/Qwen3.5-4B": "/models/Qwen/Qwen3.5-4B"},
    "samplers": {"Qwen/Qwen3.5-4B": "/sampler/Qwen/Qwen3.5-4B"},
    "processors": ["/processors"],
}


def _check_config(tmp_path, data, capsys) -> tuple[int, str]:
    path = tmp_path / "server_config.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    code = main(["check-config", "-c", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_seed_node_rank_yaml_passes_once_completed_as_check_config_asks(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    code, report = _check_config(tmp_path, seed_data(), capsys)
    assert code != 0
    assert "applications[0].args.model_id: field required" in report
    assert "applications[1].args.model_id: field required" in report
    with_ids = seed_data()
    for app in with_ids["applications"][:2]:
        app["args"]["model_id"] = "ms://Qwen/Qwen3.5-4B"
    code, report = _check_config(tmp_path, with_ids, capsys)
    assert code != 0 and "need exactly one application with import_path 'server'" in report
    code, report = _check_config(tmp_path, completed(), capsys)
    assert code != 0 and "auth: no API key source" in report  # keys: the last thing it asks
    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY")
    code, report = _check_config(tmp_path, completed(), capsys)
    assert code == 0, report
    assert "OK: 4 applications" in report


def test_the_table_lists_every_application_at_its_configured_prefix():
    assert route_table(parse_config(completed())) == SEED_TABLE


def test_the_gateway_serves_the_table_to_keyed_callers(tmp_path):
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    data = completed("tiny://qwen3.5", cpu=True)
    for app in data["applications"]:
        if app["import_path"] == "model":
            app["args"]["backend"] = "mock"
        if app["import_path"] == "sampler":
            app["args"]["sampler_type"] = "mock"
    data["auth"] = {"api_keys": list(KEYS.values())}
    data["storage"] = {"root": str(tmp_path / "storage")}
    server = build_local_server(parse_config(data), store=MemoryStore("rt:"))

    async def scenario():
        async with client(server, who=None) as anon:
            assert (await anon.get("/api/v1/routes")).status_code == 401
        async with client(server) as alice:
            reply = await alice.get("/api/v1/routes")
            assert reply.status_code == 200
            assert reply.json() == {
                **SEED_TABLE,
                "models": {"tiny/qwen3.5": "/models/Qwen/Qwen3.5-4B"},
                "samplers": {"tiny/qwen3.5": "/sampler/Qwen/Qwen3.5-4B"},
            }
            health = await alice.get("/models/Qwen/Qwen3.5-4B/healthz")
            assert health.json()["base_model"] == "tiny/qwen3.5"
            assert (await alice.get("/processors/healthz")).status_code == 200

    asyncio.run(scenario())
