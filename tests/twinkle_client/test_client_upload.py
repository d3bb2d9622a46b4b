"""``upload_to_hub`` through twinkle_client against an in-process server and the loopback
ModelScope stand-in: which token arrives, which repository, the adapter files byte for byte, and
nothing at all for another tenant's checkpoint or a path trick."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from serving import KEYS, MODEL_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle" / "hub"))

from modelscope_standin import serve_standin  # noqa: E402

from twinkle_client import init_twinkle_client  # noqa: E402
from twinkle_client.errors import NotFoundError, TwinkleServerError  # noqa: E402
from twinkle_client.model import MultiLoraTransformersModel  # noqa: E402

FEATURES = [{"input_ids": list(range(10, 22)), "labels": [-100] * 3 + list(range(13, 22))}]
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """Alice's server key is also a ModelScope token (user alice); bob's is not."""
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    with serve_standin({KEYS["alice"]: "alice", "ms-server": "twinkle-bot"}) as standin:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", standin.url)
        yield standin


@pytest.fixture(scope="module")
def saved(live):
    """Alice's checkpoint saved with optimizer state: (twinkle path, its directory)."""
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8})
    model.set_optimizer("Adam", lr=1e-3)
    model.forward_backward(inputs=FEATURES)
    model.clip_grad_and_step()
    path = model.save("to-hub", save_optimizer=True)
    owner = live[1].context.authenticate({"x-api-key": KEYS["alice"]})
    directory = Path(live[1].context.state.resolve_checkpoint_path(owner, path).local_dir)
    yield model, path, directory
    model.remove_adapter()
    client.close()


def _sent(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ADAPTER_FILES}


def test_the_callers_modelscope_key_publishes_the_adapter_files(hub, saved):
    model, path, directory = saved
    assert {"optimizer.pt", "trainer_state.json"} <= {p.name for p in directory.iterdir()}
    reply = model.upload_to_hub(
        checkpoint_dir=path, hub_model_id="alice/twinkle-self-cognition", async_upload=False
    )
    assert reply["token"] == "caller" and set(reply["files"]) == ADAPTER_FILES
    assert hub.files["alice/twinkle-self-cognition"] == _sent(directory)
    assert hub.tokens_used() == {KEYS["alice"]}


def test_the_callers_key_comes_first_even_with_a_server_token(hub, saved, monkeypatch):
    model, path, directory = saved
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-server")
    reply = model.upload_to_hub(checkpoint_dir=path, hub_model_id="alice/first")
    assert reply["token"] == "caller"  # the seed's rule (hub.caller_key: first, the default)
    assert hub.files["alice/first"] == _sent(directory)
    assert hub.tokens_used() == {KEYS["alice"]}


def test_async_upload_returns_at_once_and_finishes(hub, saved):
    model, path, directory = saved
    reply = model.upload_to_hub(path, "alice/async", async_upload=True)
    assert reply["status"] == "started"
    deadline = time.monotonic() + 60
    while "alice/async" not in hub.files:
        assert time.monotonic() < deadline, "the background upload did not finish"
        time.sleep(0.05)
    assert hub.files["alice/async"] == _sent(directory)


def test_another_tenants_checkpoint_or_a_path_trick_uploads_nothing(hub, saved, live):
    _, path, _ = saved
    bob = init_twinkle_client(base_url=live[0], api_key=KEYS["bob"], timeout=120)
    try:
        theirs = MultiLoraTransformersModel(model_id=MODEL_ID, client=bob)
        with pytest.raises(NotFoundError, match="not found"):
            theirs.upload_to_hub(checkpoint_dir=path, hub_model_id="bob/stolen")
        run = path.split("/")[2]
        for trick in (f"twinkle://{run}/weights/../weights/to-hub", "/etc", str(saved[2])):
            with pytest.raises(TwinkleServerError):
                theirs.upload_to_hub(checkpoint_dir=trick, hub_model_id="bob/stolen")
    finally:
        bob.close()
    assert hub.requests == []


def test_a_key_the_hub_rejects_without_a_server_token_is_a_clear_error(hub, live):
    bob = init_twinkle_client(base_url=live[0], api_key=KEYS["bob"], timeout=120)
    try:
        model = MultiLoraTransformersModel(model_id=MODEL_ID, client=bob)
        model.add_adapter_to_model("default", {"r": 4})
        path = model.save("bobs")
        with pytest.raises(TwinkleServerError, match="MODELSCOPE_API_TOKEN"):
            model.upload_to_hub(checkpoint_dir=path, hub_model_id="bob/x")
        model.remove_adapter()
    finally:
        bob.close()
    assert hub.files == {} and {r.path for r in hub.requests} == {"/openapi/v1/users/me"}
