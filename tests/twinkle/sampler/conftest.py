"""Shared fixtures: one tiny trainer and sampler per model id, adapters saved once per session."""

import pytest
import torch
from peft import LoraConfig

from twinkle.model import MultiLoraTransformersModel
from twinkle.sampler import TorchSampler

MODEL_IDS = ["tiny://qwen3", "tiny://qwen3.5"]


@pytest.fixture(scope="session")
def adapter_root(tmp_path_factory):
    return tmp_path_factory.mktemp("adapters")


def _trainer(model_id: str) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(model_id)
    for i, r in enumerate((4, 8, 4)):
        # Random A and B so every adapter changes the outputs.
        model.add_adapter_to_model(
            f"t{i}", LoraConfig(r=r, lora_alpha=2 * r, init_lora_weights=False), seed=i + 1
        )
    return model


@pytest.fixture(scope="session", params=MODEL_IDS)
def setup(request, adapter_root):
    """(model_id, trainer, sampler, [adapter paths]) for each tiny model."""
    model_id = request.param
    trainer = _trainer(model_id)
    out = adapter_root / model_id.replace("://", "-")
    paths = [trainer.save(f"a{i}", output_dir=out, adapter_name=f"t{i}") for i in range(3)]
    sampler = TorchSampler(model_id, max_loras=8, allowed_adapter_dirs=[adapter_root])
    sampler.set_template("Qwen3_5Template", model_id=model_id)
    return model_id, trainer, sampler, paths


@pytest.fixture(scope="session")
def qwen35(adapter_root):
    model_id = "tiny://qwen3.5"
    trainer = _trainer(model_id)
    out = adapter_root / "qwen35-extra"
    paths = [trainer.save(f"a{i}", output_dir=out, adapter_name=f"t{i}") for i in range(3)]
    return model_id, trainer, paths


def prompts(n: int = 3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(123)
    return [torch.randint(10, 4000, (3 + 2 * i,), generator=gen).tolist() for i in range(n)]
