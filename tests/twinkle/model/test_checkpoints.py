"""Checkpoints: PEFT layout, exact resume, atomic writes, safe names."""

import json
import os

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.lora import RowRoute


def _model(dropout=0.1):
    m = MultiLoraTransformersModel("tiny://qwen3")
    m.add_adapter_to_model(
        "t", LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout), gradient_accumulation_steps=2
    )
    m.set_optimizer("AdamW", lr=5e-3, weight_decay=0.01)
    m.set_lr_scheduler("cosine", num_warmup_steps=2, num_training_steps=12)
    return m


def _train(m, batches):
    losses = []
    for b in batches:
        losses.append(m.forward_backward(b)["loss"])
        m.clip_grad_and_step()
    return losses


def test_saved_adapter_loads_in_peft_with_equal_logits(tmp_path):
    m = _model(dropout=0.0)
    _train(m, [make_batch(seed=i) for i in range(4)])
    path = m.save("peft-check", output_dir=tmp_path)
    assert sorted(os.listdir(path)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "trainer_state.json",
    ]
    config = json.loads((tmp_path / "peft-check" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(m.model_dir), path
    ).eval()
    ids = make_batch(seed=9)["input_ids"]
    with torch.no_grad(), m.routes([RowRoute("t", 0, ids.shape[0])]):
        ours = m.model(input_ids=ids).logits
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
        base = m.model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - base).abs().max() > 1e-3  # the adapter really changed the output


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    batches = [make_batch(seed=i) for i in range(10)]
    torch.manual_seed(123)
    straight = _model()
    expected = _train(straight, batches)

    torch.manual_seed(123)
    first = _model()
    _train(first, batches[:5])  # stops mid accumulation window (micro step 5, GA 2)
    path = first.save("mid", output_dir=tmp_path, save_optimizer=True, consumed_train_samples=20)
    torch.manual_seed(999)  # whatever happens in between must not matter
    _train(first, batches[5:7])

    resumed = _model()
    progress = resumed.resume_from_checkpoint(path)
    assert progress["cur_step"] == 2 and progress["consumed_train_samples"] == 20
    assert _train(resumed, batches[5:]) == expected[5:]
    for key, value in straight.adapter_state_dict().items():
        assert torch.equal(value, resumed.adapter_state_dict()[key])


def test_load_restores_weights_only_and_rejects_other_ranks(tmp_path):
    m = _model(dropout=0.0)
    _train(m, [make_batch(seed=i) for i in range(2)])
    path = m.save("w", output_dir=tmp_path)
    fresh = _model(dropout=0.0)
    fresh.load(path)
    for key, value in m.adapter_state_dict().items():
        assert torch.equal(value, fresh.adapter_state_dict()[key])
    with pytest.raises(ValueError, match="without optimizer"):
        fresh.resume_from_checkpoint(path)
    other = MultiLoraTransformersModel("tiny://qwen3")
    other.add_adapter_to_model("t", LoraConfig(r=4))
    with pytest.raises(ValueError, match="rank"):
        other.load(path)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        other.load(tmp_path / "missing")


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/b", "..", "", ".hidden", "a\\b"])
def test_checkpoint_names_cannot_escape(tmp_path, name):
    m = _model()
    with pytest.raises(ValueError):
        m.save(name, output_dir=tmp_path / "out")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_crash_mid_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    m = _model()
    _train(m, [make_batch(), make_batch(seed=1)])
    good = m.save("ck", output_dir=tmp_path, save_optimizer=True)
    before = sorted(os.listdir(good))

    import twinkle.model.engine._checkpoints as impl

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(impl.torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        m.save("ck", output_dir=tmp_path, save_optimizer=True)
    with pytest.raises(OSError):
        m.save("new", output_dir=tmp_path, save_optimizer=True)
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no temp dirs, no half 'new'
    assert sorted(os.listdir(good)) == before
