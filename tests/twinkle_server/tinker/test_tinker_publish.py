"""Tinker's ``publish_checkpoint_from_tinker_path`` through the unmodified SDK, against a server
with ``hub.caller_key: first`` and the loopback ModelScope stand-in: the caller's key publishes
when the hub accepts it as a ModelScope token, else the server's token; another tenant's
checkpoint publishes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tinker

from twinkle.server.testing import KEYS, config_dict, serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "twinkle" / "hub"))

from modelscope_standin import serve_standin  # noqa: E402

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    config = config_dict(
        model_id="tiny://qwen3.5",
        server_args={"server_config": {"supported_models": [BASE_MODEL]}},
    )
    config["storage"] = {"root": str(tmp_path_factory.mktemp("publish") / "storage")}
    config["hub"] = {"caller_key": "first", "namespace": "twinkle-org"}
    server = build_local_server(parse_config(config), store=MemoryStore("pub:"))
    with serve_in_thread(server.app) as url:
        yield url, server


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """Alice's server key is also a ModelScope token (user alice); bob's is not; the server's
    own token ``ms-server`` may write the twinkle-org namespace."""
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-server")
    with serve_standin({KEYS["alice"]: "alice", "ms-server": "twinkle-org"}) as standin:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", standin.url)
        yield standin


def _service(url: str, who: str):
    from twinkle_client import init_tinker_client

    init_tinker_client()
    return tinker.ServiceClient(base_url=url, api_key=KEYS[who])


@pytest.fixture(scope="module")
def checkpoints(server):
    """``{who: (tinker path, checkpoint directory)}`` of one saved state per tenant."""
    found, services = {}, []
    for who in ("alice", "bob"):
        service = _service(server[0], who)
        services.append(service)
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4)
        training = training.result(timeout=60)
        path = training.save_state(f"{who}-state").result(timeout=60).path
        owner = server[1].context.authenticate({"x-api-key": KEYS[who]})
        from twinkle.server.tinker.convert import to_twinkle_path

        record = server[1].context.state.resolve_checkpoint_path(owner, to_twinkle_path(path))
        found[who] = (path, Path(record.local_dir), service)
    yield found
    for service in services:
        service.close("success").result(timeout=30)


def _repo(path: str) -> str:
    run, _, name = path.removeprefix("tinker://").split("/")
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in f"{run}-{name}")


def _adapter(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ADAPTER_FILES}


def test_the_callers_modelscope_key_publishes_under_the_callers_name(hub, checkpoints):
    path, directory, service = checkpoints["alice"]
    service.create_rest_client().publish_checkpoint_from_tinker_path(path).result(timeout=60)
    repo_id = f"alice/{_repo(path)}"
    assert hub.files == {repo_id: _adapter(directory)}  # no optimizer state
    assert hub.tokens_used() == {KEYS["alice"]}  # the key itself, without the SDK's tml- prefix
    runs = service.create_rest_client().list_checkpoints(path.split("/")[2]).result(timeout=30)
    assert [c.public for c in runs.checkpoints if c.tinker_path == path] == [True]


def test_a_key_that_is_no_modelscope_token_falls_back_to_the_servers(hub, checkpoints):
    path, directory, service = checkpoints["bob"]
    service.create_rest_client().publish_checkpoint_from_tinker_path(path).result(timeout=60)
    repo_id = f"twinkle-org/{_repo(path)}"
    assert hub.files == {repo_id: _adapter(directory)}
    writes = {r.token for r in hub.writes()}
    assert writes == {"ms-server"}  # bob's key was only asked about, never used to write
    assert hub.tokens_used() == {KEYS["bob"], "ms-server"}


def test_without_a_server_token_a_rejected_key_is_a_clear_error(hub, checkpoints, monkeypatch):
    monkeypatch.delenv("MODELSCOPE_API_TOKEN")
    path, _, service = checkpoints["bob"]
    with pytest.raises(tinker.APIStatusError, match="no hub token of its own"):
        service.create_rest_client().publish_checkpoint_from_tinker_path(path).result(timeout=30)
    assert hub.files == {}


def test_another_tenants_checkpoint_publishes_nothing(hub, checkpoints):
    alices_path = checkpoints["alice"][0]
    bob = checkpoints["bob"][2]
    with pytest.raises(tinker.NotFoundError):
        bob.create_rest_client().publish_checkpoint_from_tinker_path(alices_path).result(timeout=30)
    assert hub.requests == []
