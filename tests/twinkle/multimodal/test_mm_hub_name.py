"""Issue 30 point 1: a Qwen3.5 checkpoint cached under its real ModelScope name
(``ms://Qwen/Qwen3.5-4B``) loads as the multimodal model, the way ``tiny://qwen3.5-vl`` does,
and trains an image tenant to the same loss (the tiny weights seeded under the real name)."""

from __future__ import annotations

import pytest
from peft import LoraConfig

from tests.twinkle.multimodal.conftest import VL_MODEL, image_trajectories
from twinkle.hub import resolve_model_dir, seed_modelscope_cache
from twinkle.model import MultiLoraTransformersModel


@pytest.fixture
def seeded(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    monkeypatch.setenv("MODELSCOPE_OFFLINE", "1")
    return seed_modelscope_cache("Qwen/Qwen3.5-4B", resolve_model_dir(VL_MODEL))


def _image_loss(model_id: str) -> tuple[str, float]:
    model = MultiLoraTransformersModel(model_id)
    model.add_adapter_to_model("img", LoraConfig(r=4, lora_alpha=8, init_lora_weights=False))
    model.set_template("Qwen3_5Template", adapter_name="img")
    out = model.forward_only(inputs=image_trajectories(2), adapter_name="img")
    return type(model.model).__name__, float(out["loss"])


def test_the_real_name_loads_the_multimodal_model_and_scores_images_alike(seeded):
    assert resolve_model_dir("ms://Qwen/Qwen3.5-4B") == seeded
    kind, loss = _image_loss("ms://Qwen/Qwen3.5-4B")
    assert kind == "Qwen3_5ForConditionalGeneration"
    assert loss == pytest.approx(_image_loss(VL_MODEL)[1], rel=1e-6)
