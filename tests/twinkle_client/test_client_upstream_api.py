"""What ModelScope Twinkle's client scripts call on ``twinkle_client``, against a live server:
``save()`` as path and ``SaveResponse``, ``is_sampler``, ``load_optimizer``, ``resume_only_model``,
``get_state_dict``, ``forward_only().result``, ``save_dir``, ``client.model()``, and the management
calls (capacity, runs with a cursor, weights info, deleting a checkpoint)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from serving import KEYS, MODEL_ID

from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.errors import BadRequestError, NotFoundError
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.types import ForwardOutput, SavedCheckpoint

FEATURES = [{"input_ids": list(range(10, 22)), "labels": [-100] * 3 + list(range(13, 22))}]


@pytest.fixture(scope="module")
def alice(live):
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


@pytest.fixture
def model(alice):
    model = alice.model(MODEL_ID)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.add_adapter_to_model(
            "default", {"r": 4, "lora_alpha": 8}, gradient_accumulation_steps=1, save_dir="/tmp/x"
        )
    assert any("save_dir='/tmp/x' ignored" in str(w.message) for w in caught)
    model.set_optimizer("Adam", lr=1e-2)
    yield model
    model.remove_adapter()


def _step(model) -> None:
    model.forward_backward(inputs=FEATURES)
    model.clip_grad_and_step()


def _directory(live, path: str) -> Path:
    owner = live[1].context.authenticate({"x-api-key": KEYS["alice"]})
    return Path(live[1].context.state.resolve_checkpoint_path(owner, path).local_dir)


def test_client_model_is_bound_to_its_client(alice, model):
    assert isinstance(model, MultiLoraTransformersModel) and model.client is alice


def test_save_is_the_path_and_a_save_response(model):
    _step(model)
    saved = model.save("ck", save_optimizer=True, consumed_train_samples=1)
    run = model.training_run_id
    assert isinstance(saved, SavedCheckpoint) and saved == f"twinkle://{run}/weights/ck"
    assert saved.twinkle_path == saved and saved.checkpoint_dir is None
    sampler = model.save("for-sampler", is_sampler=True)
    assert sampler == f"twinkle://{run}/sampler_weights/for-sampler"
    assert sampler.checkpoint_type == "sampler_weights"
    assert model.save("for-sampler", is_sampler=True) == sampler  # the same name replaces it
    with pytest.raises(BadRequestError, match="drop save_optimizer"):
        model.save("both", is_sampler=True, save_optimizer=True)


def test_load_optimizer_and_resume_only_model(model, live):
    _step(model)
    checkpoint = model.save("one-step", save_optimizer=True, consumed_train_samples=3)
    weights = model.get_state_dict()
    _step(model)
    _step(model)
    assert model.calculate_metric().result["step"] == 3

    progress = model.resume_from_checkpoint(checkpoint, resume_only_model=True)
    assert progress["cur_step"] == 1 and progress["consumed_train_samples"] == 3
    assert model.calculate_metric().result["step"] == 3  # only the weights came back
    for key, value in model.get_state_dict().items():
        np.testing.assert_allclose(value, weights[key], rtol=0, atol=0)

    model.load(checkpoint, load_optimizer=True)
    assert model.calculate_metric().result["step"] == 1


def test_get_state_dict_equals_the_saved_weights(model, live):
    _step(model)
    path = model.save("weights-now")
    state = model.get_state_dict()
    saved = load_file(str(_directory(live, path) / "adapter_model.safetensors"))
    assert set(state) == set(saved) and len(state) > 0
    for key, value in saved.items():
        assert state[key].shape == value.shape
        np.testing.assert_allclose(state[key], value.astype(np.float32), rtol=0, atol=0)


def test_forward_only_result_is_the_output_itself(model):
    out = model.forward_only(inputs=FEATURES)
    assert isinstance(out, ForwardOutput) and out.result is out
    assert len(out["logprobs"]) == 1 and len(out.result["logprobs"][0]) > 0


def test_capacity_runs_cursor_weights_info_and_delete(alice, model, live):
    capacity = alice.get_capacity_info()
    assert (capacity.max_loras, capacity.used_loras, capacity.free_loras) == (4, 1, 3)
    assert capacity.models == {"tiny/qwen3": {"max_loras": 4, "used_loras": 1, "free_loras": 3}}

    path = model.save("to-delete")
    run_id = model.training_run_id
    runs, cursor = alice.list_training_runs_with_cursor(limit=1, offset=0)
    assert len(runs) == 1 and cursor.total_count >= 1 and cursor.limit == 1
    assert run_id in [r.training_run_id for r in alice.find_training_run_by_model(MODEL_ID)]
    assert alice.find_training_run_by_model("ms://Qwen/Qwen3.5-4B") == []
    assert '"training_run_id"' in runs[0].model_dump_json(indent=2)

    info = alice.get_weights_info(path)
    assert (info.training_run_id, info.base_model, info.lora_rank) == (run_id, "tiny/qwen3", 4)
    assert info.checkpoint_type == "weights" and info.twinkle_path == path

    with TwinkleClient(base_url=live[0], api_key=KEYS["bob"]) as bob:
        assert bob.list_training_runs(all_users=True) == []  # no key sees another key's runs
        with pytest.raises(NotFoundError):
            bob.get_weights_info(path)
        with pytest.raises(NotFoundError):
            bob.delete_checkpoint(run_id, "to-delete")

    directory = _directory(live, path)
    reply = alice.delete_checkpoint(run_id, "to-delete")
    assert reply.success and reply.twinkle_path == path
    assert path not in [c.twinkle_path for c in alice.list_checkpoints(run_id)]
    assert not directory.exists()
    with pytest.raises(NotFoundError):
        alice.delete_checkpoint(run_id, "weights/to-delete")
