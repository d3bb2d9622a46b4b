"""The local model keeps the same history as the server, per adapter, and a local loop sends it
to a tracker."""

import numpy as np
import pytest
from test_trackers import tensorboard_scalars

from twinkle.model import MockModel, MultiLoraTransformersModel
from twinkle.tracking import TrainingHistory, export_history, make_tracker


def rows(seed: int) -> list[dict]:
    ids = np.random.default_rng(seed).integers(10, 200, size=(2, 12)).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


@pytest.fixture(scope="module")
def model():
    return MultiLoraTransformersModel("tiny://qwen3", seed=0)


@pytest.mark.parametrize("backend", ["transformers", "mock"])
def test_every_step_kind_adds_one_point_with_its_figures(backend, model):
    m = model if backend == "transformers" else MockModel("tiny://qwen3", vocab_size=256)
    m.add_adapter_to_model("h", {"r": 4, "lora_alpha": 8})
    m.add_adapter_to_model("other", {"r": 4, "lora_alpha": 8})
    try:
        m.set_optimizer("Adam", adapter_name="h", lr=0.01)
        losses = []
        for step in range(2):
            losses.append(float(m.forward_backward(rows(step), adapter_name="h")["loss"]))
            assert m.clip_grad_and_step(1.0, adapter_name="h")
        losses.append(float(m.forward_backward(rows(2), adapter_name="h")["loss"]))
        result = m.optim_step({"learning_rate": 0.002}, adapter_name="h")
        history = m.get_training_history(adapter_name="h")
        assert isinstance(history, TrainingHistory) and history.run_id == "h"
        assert [p.step for p in history.points] == [1, 2, 3] and history.recorded == 3
        assert [p.loss for p in history.points] == pytest.approx(losses)
        assert [p.learning_rate for p in history.points] == pytest.approx([0.01, 0.01, 0.002])
        assert history.points[2].grad_norm == pytest.approx(result["grad_norm"])
        assert all(p.num_tokens == 22 and p.micro_batches == 1 for p in history.points)
        assert [p.step for p in m.get_training_history("h", since_step=2).points] == [3]
        assert m.get_training_history(adapter_name="other").points == []
    finally:
        m.remove_adapter("h")
        m.remove_adapter("other")


def test_a_local_loop_sends_its_history_to_tensorboard(tmp_path):
    m = MockModel("tiny://qwen3", vocab_size=256)
    m.add_adapter_to_model("a", {"r": 4})
    m.set_optimizer("Adam", adapter_name="a", lr=0.05)
    for step in range(4):
        m.forward_backward(rows(step), adapter_name="a")
        m.clip_grad_and_step(adapter_name="a")
    history = m.get_training_history(adapter_name="a")
    export_history(history, make_tracker("tensorboard", path=tmp_path))
    logged = tensorboard_scalars(tmp_path)["loss"]
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    assert [v for _, v in logged] == pytest.approx([p.loss for p in history.points], rel=1e-6)
