"""``TwinkleClient`` against a live server: management API, session heartbeats, remote models."""

from __future__ import annotations

import threading
import time

import pytest
from serving import KEYS, MODEL_ID

from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.client import get_default_client, served_model_name
from twinkle_client.errors import AuthenticationError, NotFoundError
from twinkle_client.model import MultiLoraTransformersModel, TransformersModel
from twinkle_client.model.multi_lora import lora_config_dict

FEATURES = [{"input_ids": list(range(10, 22)), "labels": [-100] * 3 + list(range(13, 22))}]


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.02)


@pytest.fixture
def alice(live):
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


def test_model_ids_map_to_their_routes():
    assert served_model_name("ms://Qwen/Qwen3.5-4B") == "Qwen/Qwen3.5-4B"
    assert served_model_name("tiny://qwen3.5") == "tiny/qwen3.5"
    assert served_model_name("hf://org/name") == "org/name"
    assert served_model_name("Qwen/Qwen3.5-4B") == "Qwen/Qwen3.5-4B"


def test_health_and_capabilities(alice):
    assert alice.health_check() is True
    caps = alice.get_server_capabilities()
    assert [m.model_name for m in caps.supported_models] == ["tiny/qwen3"]
    assert caps.supported_models[0].trainable is True
    assert '"model_name": "tiny/qwen3"' in caps.model_dump_json(indent=2)


def test_runs_checkpoints_and_resume_through_the_management_api(alice, live):
    model = MultiLoraTransformersModel(model_id=MODEL_ID)  # finds the default client
    assert model.client is alice and get_default_client() is alice
    model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8}, gradient_accumulation_steps=1)
    model.set_optimizer("Adam", lr=1e-3)
    model.forward_backward(inputs=FEATURES)
    model.clip_grad_and_step()
    first = model.save("ck-1", save_optimizer=True, consumed_train_samples=1)
    model.forward_backward(inputs=FEATURES)
    model.clip_grad_and_step()
    second = model.save("ck-2", save_optimizer=True, consumed_train_samples=2)
    run_id = model.training_run_id
    try:
        assert first == f"twinkle://{run_id}/weights/ck-1"
        runs = alice.list_training_runs(limit=20)
        assert run_id in [r.training_run_id for r in runs]
        assert alice.get_training_run(run_id).lora_rank == 4
        checkpoints = alice.list_checkpoints(run_id)
        assert [c.twinkle_path for c in checkpoints] == [first, second]
        assert '"twinkle_path"' in checkpoints[0].model_dump_json(indent=2)
        assert alice.get_checkpoint_path(run_id, "ck-1") == first
        assert alice.get_latest_checkpoint_path(run_id) == second
        with pytest.raises(NotFoundError):
            alice.get_checkpoint_path(run_id, "nope")
        progress = model.resume_from_checkpoint(alice.get_latest_checkpoint_path(run_id))
        assert progress["cur_step"] == 2 and progress["consumed_train_samples"] == 2
        with TwinkleClient(base_url=live[0], api_key=KEYS["bob"]) as bob:
            with pytest.raises(NotFoundError):
                bob.get_training_run(run_id)
            assert bob.list_training_runs() == []
    finally:
        model.remove_adapter()


def test_heartbeats_run_in_the_background_and_stop_on_close(live):
    url, server = live
    state, owner = (
        server.context.state,
        server.context.authenticate({"authorization": f"Bearer {KEYS['alice']}"}),
    )
    client = TwinkleClient(base_url=url, api_key=KEYS["alice"], heartbeat_interval_s=0.05)
    session = state.get_session(owner, client.session_id)
    _wait_for(
        lambda: state.get_session(owner, client.session_id).last_heartbeat > session.last_heartbeat
    )
    beats = [t for t in threading.enumerate() if t.name == "twinkle-heartbeat" and t.daemon]
    assert beats
    with client:
        pass  # the context manager closes it
    assert client._heartbeat is not None and not client._heartbeat.is_alive()
    assert state.get_session(owner, client.session_id).finished is True
    client.close()  # idempotent


def test_server_errors_reach_the_user(alice, live):
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    with pytest.raises(NotFoundError, match="unknown adapter 'ghost'"):
        model.forward_backward(inputs=FEATURES, adapter_name="ghost")
    with pytest.raises(AuthenticationError, match="rejected the API key"):
        TwinkleClient(base_url=live[0], api_key="not-a-key")
    model.add_adapter_to_model("hub", {"r": 4})
    try:
        with pytest.raises(NotFoundError, match="checkpoint twinkle://x/weights/y not found"):
            model.upload_to_hub(checkpoint_dir="twinkle://x/weights/y", hub_model_id="me/model")
        with pytest.raises(TypeError, match="by name"):
            model.set_loss(object())
    finally:
        model.remove_adapter("hub")


def test_peft_configs_travel_without_peft_on_the_client(alice):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    wire = lora_config_dict(config)
    assert wire["r"] == 4 and wire["peft_type"] == "LORA" and wire["target_modules"] == "all-linear"
    model = TransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model("peft", config)
    try:
        configs = model.get_train_configs()
        assert configs.model_dump()["lora"]["r"] == 4 and configs.adapter_name == "peft"
        with pytest.raises(ValueError, match="at most 1"):
            model.add_adapter_to_model("second", {"r": 4})
        metric = model.calculate_metric(is_training=True)
        assert metric.result["step"] == 0
    finally:
        model.remove_adapter()


def test_environment_variables_configure_the_client(live, monkeypatch):
    monkeypatch.setenv("TWINKLE_SERVER_URL", live[0])
    monkeypatch.setenv("TWINKLE_SERVER_TOKEN", KEYS["bob"])
    with init_twinkle_client(heartbeat_interval_s=None) as client:
        assert client.base_url == live[0] and client.api_key == KEYS["bob"]
        assert client.list_training_runs() == []
