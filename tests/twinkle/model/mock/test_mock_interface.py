"""MockModel interface: checkpoints, adapter resolution, errors, and running without torch."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from twinkle.model.mock import MockModel, UnknownAdapterError

pytestmark = pytest.mark.unit

BATCH = [{"input_ids": [3, 1, 4, 1, 5, 9], "labels": [-100, 1, 4, 1, 5, 9]}]


def _model(name="a", accum=1):
    model = MockModel(vocab_size=32, hidden_size=8, seed=3)
    model.add_adapter_to_model(name, {"r": 4, "lora_alpha": 16}, gradient_accumulation_steps=accum)
    model.set_optimizer("AdamW", lr=1e-2, weight_decay=0.1)
    model.set_lr_scheduler("cosine", T_max=20)
    return model


def _steps(model, n):
    losses = []
    for _ in range(n):
        losses.append(model.forward_backward(BATCH)["loss"])
        model.clip_grad_and_step()
    return losses


def test_save_and_resume_continue_identically(tmp_path):
    straight = _model(accum=2)
    _steps(straight, 6)
    expected = _steps(straight, 6)

    first = _model(accum=2)
    _steps(first, 6)
    path = first.save(
        "step-3", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=6
    )
    expected_files = ["adapter_config.json", "adapter_model.npz", "optimizer.npz"]
    assert sorted(os.listdir(path)) == expected_files + ["trainer_state.json"]
    assert os.listdir(tmp_path) == ["step-3"], "no temporary directory may be left behind"

    resumed = _model(accum=2)
    progress = resumed.resume_from_checkpoint(path)
    assert progress == {"cur_step": 3, "consumed_train_samples": 6}
    assert _steps(resumed, 6) == expected


def test_save_overwrites_atomically_and_load_restores_weights(tmp_path):
    model = _model()
    _steps(model, 2)
    model.save("ckpt", output_dir=str(tmp_path))
    _steps(model, 2)
    path = model.save("ckpt", output_dir=str(tmp_path))
    assert os.listdir(tmp_path) == ["ckpt"]
    with open(os.path.join(path, "adapter_config.json")) as handle:
        assert json.load(handle)["r"] == 4
    fresh = _model()
    fresh.load(path)
    for key in ("A", "B"):
        assert np.array_equal(fresh._adapters["a"].params[key], model._adapters["a"].params[key])
    assert fresh.forward_only(BATCH)["loss"] == model.forward_only(BATCH)["loss"]


def test_checkpoint_name_cannot_escape(tmp_path):
    model = _model()
    for name in ("../evil", "a/b", "..", ""):
        with pytest.raises(ValueError, match="checkpoint name"):
            model.save(name, output_dir=str(tmp_path))


def test_load_rejects_rank_mismatch(tmp_path):
    path = _model().save("c", output_dir=str(tmp_path))
    other = MockModel(vocab_size=32, hidden_size=8, seed=3)
    other.add_adapter_to_model("a", {"r": 2, "lora_alpha": 16})
    with pytest.raises(ValueError, match="rank"):
        other.load(path)


def test_adapter_resolution_errors():
    model = MockModel(vocab_size=32, hidden_size=8)
    with pytest.raises(ValueError, match="adapter_name is required"):
        model.forward_only(BATCH)
    model.add_adapter_to_model("a", {"r": 2})
    model.add_adapter_to_model("b", {"r": 2})
    with pytest.raises(ValueError, match="adapter_name is required"):
        model.set_loss("CrossEntropyLoss")
    with pytest.raises(UnknownAdapterError, match="'ghost'"):
        model.forward_only(BATCH, adapter_name="ghost")
    with pytest.raises(KeyError):
        model.remove_adapter("ghost")
    with pytest.raises(ValueError, match="already exists"):
        model.add_adapter_to_model("a", {"r": 2})
    model.remove_adapter("b")
    assert model.forward_only(BATCH)["loss"] > 0  # "a" is now the only adapter


def test_setting_errors():
    model = _model()
    with pytest.raises(ValueError, match="losses"):
        model.set_loss("DPOLoss")
    with pytest.raises(ValueError, match="optimizer"):
        model.set_optimizer("Lion")
    with pytest.raises(ValueError, match="scheduler"):
        model.set_lr_scheduler("StepLR")
    with pytest.raises(ValueError, match="token ids"):
        model.forward_only([{"input_ids": [0, 99]}])
    bare = MockModel(vocab_size=32, hidden_size=8)
    bare.add_adapter_to_model("x", {"r": 2})
    bare.forward_backward(BATCH)
    with pytest.raises(ValueError, match="set_optimizer"):
        bare.clip_grad_and_step()


def test_accepts_a_peft_lora_config_object():
    peft = pytest.importorskip("peft")
    model = MockModel(vocab_size=32, hidden_size=8)
    model.add_adapter_to_model("a", peft.LoraConfig(r=8, lora_alpha=32))
    assert model._adapters["a"].scale == 4.0


def test_imports_and_trains_without_torch():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        from twinkle.model.mock import MockModel
        m = MockModel(vocab_size=16, hidden_size=4)
        m.add_adapter_to_model("a", {"r": 2, "lora_alpha": 4})
        m.set_optimizer("SGD", lr=0.1)
        loss = m.forward_backward([{"input_ids": [1, 2, 3]}])["loss"]
        m.clip_grad_and_step()
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print("ok", loss > 0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok True"
