"""The seed's tenant A loop and the README demo, run locally on the shipped data."""

import pytest
import torch
from peft import LoraConfig

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MultiLoraTransformersModel


@pytest.fixture(scope="module")
def dataloader():
    dataset = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition", data_slice=range(80)))
    dataset.set_template("Qwen3_5Template", model_id="tiny://qwen3.5", max_length=256)
    dataset.map(
        "SelfCognitionProcessor",
        init_args={"model_name": "Twinkle", "model_author": "the Twinkle team"},
    )
    dataset.encode(batched=True)
    return DataLoader(dataset=dataset, batch_size=4)


def test_seed_tenant_a_loop_lowers_loss_and_leaves_tenant_b_bitwise_unchanged(dataloader):
    model = MultiLoraTransformersModel(model_id="tiny://qwen3.5")
    model.add_adapter_to_model("tenant_a", LoraConfig(r=8, lora_alpha=32))
    model.add_adapter_to_model("tenant_b", LoraConfig(r=32, lora_alpha=64))
    # The seed's tenant A configuration, verbatim but for the learning rate of a random tiny model.
    model.set_template("Qwen3_5Template", adapter_name="tenant_a")
    model.set_processor("InputProcessor", padding_side="right", adapter_name="tenant_a")
    model.set_loss("CrossEntropyLoss", adapter_name="tenant_a")
    model.set_optimizer("Adam", lr=1e-2, adapter_name="tenant_a")
    tenant_b_before = {k: v.clone() for k, v in model.adapter_state_dict("tenant_b").items()}

    first_epoch_losses, last_epoch_losses = [], []
    for epoch in range(2):
        for batch in dataloader:
            out = model.forward_backward(inputs=batch, adapter_name="tenant_a")
            model.clip_grad_and_step(adapter_name="tenant_a")
            (first_epoch_losses if epoch == 0 else last_epoch_losses).append(out["loss"])
    assert (
        model.calculate_metric(adapter_name="tenant_a").result["step"] == 2 * len(dataloader) == 40
    )
    # Same batches in both epochs: the second pass over them must be clearly better.
    assert sum(last_epoch_losses) / 20 < sum(first_epoch_losses) / 20 - 0.3
    after = model.adapter_state_dict("tenant_b")
    assert all(torch.equal(tenant_b_before[k], after[k]) for k in after)


def test_readme_demo_runs_and_writes_checkpoints_and_curves(tmp_path):
    from twinkle import demo

    history = demo.run("tiny://qwen3.5", steps=3, output_dir=tmp_path, log_every=2)
    assert set(history) == {"tenant_a", "tenant_b"} and all(len(v) == 3 for v in history.values())
    for tenant in history:
        assert (tmp_path / tenant / "step-3" / "adapter_model.safetensors").is_file()
        assert (tmp_path / tenant / "step-3" / "optimizer.pt").is_file()
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for tenant in ("tenant_a", "tenant_b"):  # the training history, read back by TensorBoard
        board = EventAccumulator(str(tmp_path / "tensorboard" / tenant))
        board.Reload()
        assert [e.step for e in board.Scalars("loss")] == [1, 2, 3]
