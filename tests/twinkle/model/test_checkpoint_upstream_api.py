"""The checkpoint calls ModelScope Twinkle's scripts make, on the local model: ``save()`` that is
both the path and has ``.twinkle_path``, ``save_dir``, ``is_sampler``, ``load_optimizer``,
``resume_only_model`` and ``get_state_dict``."""

import pickle

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle_client.types import SavedCheckpoint


def _model(save_dir=None):
    m = MultiLoraTransformersModel("tiny://qwen3")
    m.add_adapter_to_model("t", LoraConfig(r=4, lora_alpha=8), save_dir=save_dir)
    m.set_optimizer("Adam", lr=1e-2)
    return m


def _step(m, seed=0):
    m.forward_backward(make_batch(seed=seed))
    m.clip_grad_and_step()


def test_save_returns_the_path_with_twinkle_path_and_goes_to_save_dir(tmp_path):
    m = _model(save_dir=tmp_path / "runs")
    _step(m)
    saved = m.save("ck", save_optimizer=True, consumed_train_samples=4)
    assert isinstance(saved, SavedCheckpoint) and isinstance(saved, str)
    assert saved == str(tmp_path / "runs" / "ck") == saved.twinkle_path == saved.checkpoint_dir
    assert saved.checkpoint_type == "weights"
    assert (tmp_path / "runs" / "ck" / "optimizer.pt").is_file()
    assert pickle.loads(pickle.dumps(saved)).checkpoint_dir == saved.checkpoint_dir
    assert m.save("other", output_dir=tmp_path / "explicit") == str(tmp_path / "explicit" / "other")


def test_sampler_checkpoints_hold_weights_only(tmp_path):
    m = _model(save_dir=tmp_path)
    saved = m.save("for-sampler", is_sampler=True)
    assert saved.checkpoint_type == "sampler_weights"
    assert not (tmp_path / "for-sampler" / "optimizer.pt").exists()
    with pytest.raises(InvalidArgumentError, match="drop save_optimizer"):
        m.save("both", is_sampler=True, save_optimizer=True)
    with pytest.raises(ArgumentTypeError, match="unexpected arguments: colour"):
        m.save("x", colour="red")


def test_load_optimizer_restores_the_training_state_and_plain_load_does_not(tmp_path):
    m = _model(save_dir=tmp_path)
    _step(m, seed=0)
    checkpoint = m.save("one-step", save_optimizer=True, consumed_train_samples=4)
    weights = m.get_state_dict()
    _step(m, seed=1)
    _step(m, seed=2)
    assert m.calculate_metric().result["step"] == 3

    m.load(checkpoint)  # weights only
    assert m.calculate_metric().result["step"] == 3
    for key, value in m.get_state_dict().items():
        torch.testing.assert_close(value, weights[key])

    m.load(checkpoint, load_optimizer=True)
    assert m.calculate_metric().result["step"] == 1
    assert m.tenant().consumed_train_samples == 4


def test_resume_only_model_loads_weights_and_reports_progress(tmp_path):
    m = _model(save_dir=tmp_path)
    _step(m, seed=0)
    checkpoint = m.save("ck", save_optimizer=True, consumed_train_samples=8)
    saved_weights = m.get_state_dict()
    saved_moment = m.tenant().optimizer.state_dict()["state"][0]["exp_avg"].clone()
    _step(m, seed=1)

    progress = m.resume_from_checkpoint(checkpoint, resume_only_model=True)
    assert progress["cur_step"] == 1 and progress["consumed_train_samples"] == 8
    assert progress["base_model"] == "tiny://qwen3"
    for key, value in m.get_state_dict().items():
        torch.testing.assert_close(value, saved_weights[key])
    assert m.tenant().cur_step == 2  # counters and optimizer are not restored
    moment = m.tenant().optimizer.state_dict()["state"][0]["exp_avg"]
    assert not torch.equal(moment, saved_moment)


def test_get_state_dict_is_a_copy_of_the_peft_keyed_weights():
    m = _model()
    state = m.get_state_dict()
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    assert state.keys() == m.adapter_state_dict().keys()
    first = next(iter(state))
    before = m.adapter_state_dict()[first].clone()
    state[first].add_(1.0)  # changing the copy changes nothing
    torch.testing.assert_close(m.adapter_state_dict()[first], before)
