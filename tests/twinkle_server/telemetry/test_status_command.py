"""``twinkle-server status`` against the in-process server: each key sees only its own rows."""

import asyncio
import io
import json

import httpx
import pytest

from twinkle.server.process import status
from twinkle.server.testing import KEYS, client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
ROWS = [{"input_ids": [5, 6, 7, 8, 9, 10], "labels": [5, 6, 7, 8, 9, 10]}]


@pytest.fixture
def trained(tmp_path):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            for http, name in ((alice, "sft"), (alice, "dpo"), (bob, "bobs")):
                r = await http.post(
                    f"{MODEL}/add_adapter_to_model", json={"adapter_name": name, "config": {"r": 4}}
                )
                assert r.status_code == 200, r.text
                await http.post(
                    f"{MODEL}/set_optimizer", json={"adapter_name": name, "optimizer": "Adam"}
                )
            for _ in range(2):
                r = await alice.post(
                    f"{MODEL}/forward_backward", json={"adapter_name": "sft", "inputs": ROWS}
                )
                await alice.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "sft"})
            return r.json()["result"]["loss"]

    return server, asyncio.run(scenario())


def _run(server, *argv, who="alice"):
    out = io.StringIO()
    code = status.main(
        ["--url", "http://test", "--api-key", KEYS[who], *argv],
        transport=httpx.ASGITransport(app=server.app),
        out=out,
    )
    return code, out.getvalue()


def test_table_shows_own_adapters_with_progress(trained):
    server, last_loss = trained
    code, text = _run(server, "--once")
    assert code == 0
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("MODEL"))
    assert header.split() == [
        "MODEL",
        "ADAPTER",
        "RUN",
        "STEPS",
        "TOKENS",
        "TOKENS/S",
        "LAST",
        "LOSS",
        "QUEUE",
    ]
    sft = next(line for line in lines if " sft " in line).split()
    assert (
        sft[0] == "tiny/qwen3" and sft[3] == "2" and sft[4] == "12" and sft[6] == f"{last_loss:.4f}"
    )
    assert any(" dpo " in line for line in lines)
    assert not any("bobs" in line for line in lines)
    assert "tiny/qwen3: queue depth 0 (all tenants), adapters 3/4" in text


def test_json_rows_are_isolated_per_key(trained):
    server, _ = trained
    code, text = _run(server, "--json", who="bob")
    assert code == 0
    [model] = json.loads(text)["models"]
    assert [row["adapter_name"] for row in model["tenants"]] == ["bobs"]
    assert model["tenants"][0]["steps"] == 0 and model["queue_depth"] == 0


def test_watch_refreshes_until_interrupted(trained, monkeypatch):
    server, _ = trained
    sleeps = []

    def fake_sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", fake_sleep)
    code, text = _run(server, "--watch", "0.5")
    assert code == 0 and sleeps == [0.5, 0.5]
    assert text.count("MODEL  ") == 2


def test_bad_key_and_unreachable_server_exit_1(trained, capsys):
    server, _ = trained
    out = io.StringIO()
    code = status.main(
        ["--url", "http://test", "--api-key", "wrong", "--once"],
        transport=httpx.ASGITransport(app=server.app),
        out=out,
    )
    assert code == 1 and "rejected the API key" in capsys.readouterr().err
    assert status.main(["--url", "http://127.0.0.1:9", "--once"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_url_and_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("TWINKLE_SERVER_URL", "http://srv:8000/")
    monkeypatch.setenv("TWINKLE_SERVER_TOKEN", "tok")
    args = status.build_parser().parse_args([])
    assert (args.url, args.api_key) == ("http://srv:8000/", "tok")
    assert status.api_root(args.url) == "http://srv:8000/api/v1"
    assert status.api_root("http://srv:8000/api/v1") == "http://srv:8000/api/v1"
