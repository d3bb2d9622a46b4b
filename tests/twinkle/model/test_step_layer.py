"""The training step as a layer (``twinkle.model.step``): ``collate`` needs no model and is pure,
a batch says how its targets are aligned, and the fused step called with a model's parts is the
model's own ``forward_backward_many``."""

import dataclasses

import numpy as np
import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.options import ExecutionOptions
from twinkle.model.step import TenantBatch, collate, fused_forward_backward, with_loss_inputs
from twinkle.model.step.tensors import shift_left
from twinkle.processor import InputProcessor
from twinkle.template import Template

VOCAB = 4000
NAMES = ("a", "b")


def _features():
    rng = np.random.default_rng(0)
    ids = [rng.integers(10, VOCAB, size=n) for n in (7, 5)]
    return [{"input_ids": i, "labels": np.where(np.arange(len(i)) < 2, -100, i)} for i in ids]


def _collate(inputs, kwargs, **overrides):
    args = dict(template=Template(), processor=InputProcessor(pad_token_id=0), vocab_size=VOCAB)
    return collate("t", inputs, kwargs, **{**args, **overrides})


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _assert_batches_equal(x: TenantBatch, y: TenantBatch) -> None:
    for f in dataclasses.fields(TenantBatch):
        assert _same(getattr(x, f.name), getattr(y, f.name)), f.name


def test_collate_is_pure_and_needs_no_model():
    inputs = _features()
    kwargs = {"advantages": [1.0, -1.0], "temperature": 0.5}
    first = _collate(inputs, kwargs)
    second = _collate(inputs, kwargs)
    _assert_batches_equal(first, second)
    assert kwargs == {"advantages": [1.0, -1.0], "temperature": 0.5}  # not consumed
    assert first.loss_kwargs == {"temperature": 0.5} and first.num_samples == 2
    assert first.tensors["input_ids"].shape == (2, 7)


def test_labels_are_shifted_and_target_tokens_aligned():
    shifted = _collate(make_batch(rows=2, seq=10), {}, template=None, processor=None)
    labels = make_batch(rows=2, seq=10)["labels"]
    assert shifted.alignment == "shifted"
    assert torch.equal(shifted.targets, shift_left(labels, -100))
    assert torch.equal(shifted.mask, (shift_left(labels, -100) != -100).float())

    ids = make_batch(rows=2, seq=10)["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    tinker = {"input_ids": ids[:, :-1], "target_tokens": ids[:, 1:], "attention_mask": mask[:, 1:]}
    per_token = [[0.0, 1.0, 2.0], [3.0]]
    aligned = _collate(tinker, {"advantages": per_token}, template=None, processor=None)
    want = ids[:, 1:].clone()
    want[1, -3:] = -100
    assert aligned.alignment == "aligned"
    assert torch.equal(aligned.targets, want)
    assert aligned.extras["advantages"][0, :3].tolist() == [0.0, 1.0, 2.0]  # not shifted
    # Given after the forward, per-token values follow the batch's alignment as well.
    later = with_loss_inputs(aligned, {"old_logprobs": per_token})
    assert torch.equal(later.extras["old_logprobs"], aligned.extras["advantages"])
    later = with_loss_inputs(shifted, {"old_logprobs": [[0.0, 1.0, 2.0], [3.0]]})
    assert later.extras["old_logprobs"][0, :2].tolist() == [1.0, 2.0]  # shifted like labels


def test_collate_keeps_its_validation_messages():
    with pytest.raises(ValueError, match="out of the vocabulary"):
        _collate(_features(), {}, vocab_size=100)
    with pytest.raises(ValueError, match="over max_length=6"):
        _collate(_features(), {}, template=Template(max_length=6))
    with pytest.raises(ValueError, match="no labels"):
        _collate({"input_ids": torch.ones(1, 3, dtype=torch.long)}, {})


def _model(direct_weight_grads: bool = True) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(
        "tiny://qwen3", options=ExecutionOptions(direct_weight_grads=direct_weight_grads)
    )
    for i, name in enumerate(NAMES):
        config = LoraConfig(r=4 * (i + 1), lora_alpha=8, init_lora_weights=False)
        model.add_adapter_to_model(name, config)
    model.set_loss("GRPOLoss", adapter_name="b")
    return model


def _requests(step: int) -> dict:
    return {
        "a": {"inputs": make_batch(rows=2, seq=12, seed=step)},
        "b": {"inputs": make_batch(rows=2, seq=9, seed=step + 7), "advantages": [1.0, -0.5]},
    }


def _direct_step(model: MultiLoraTransformersModel, requests: dict, direct: bool) -> dict:
    """``forward_backward_many`` spelled out over the step layer, from the model's parts."""
    vocab = model.model.get_input_embeddings().weight.shape[0]
    tenants = [model.tenants[name] for name in requests]
    batches = []
    for name, request in requests.items():
        kwargs = {k: v for k, v in request.items() if k != "inputs"}
        batches.append(
            collate(
                name, request["inputs"], kwargs, template=None, processor=None, vocab_size=vocab
            )
        )
    return fused_forward_backward(
        model.model, model.router, model.device, batches, tenants, direct_weight_grads=direct
    )


def _grads(model):
    return [p.grad.clone() for name in NAMES for p in model.tenants[name].params]


@pytest.mark.parametrize("direct", [True, False])
def test_the_fused_step_from_parts_equals_the_model_method(direct):
    through_model, from_parts = _model(direct), _model()
    for step in range(2):  # the second step finds the flat gradient buffers in place
        want = through_model.forward_backward_many(_requests(step))
        got = _direct_step(from_parts, _requests(step), direct)
        assert {n: r["loss"] for n, r in got.items()} == {n: r["loss"] for n, r in want.items()}
    for p, q in zip(_grads(from_parts), _grads(through_model)):
        assert torch.equal(p, q)


def test_direct_weight_grads_on_and_off_give_the_same_gradients():
    direct, autograd = _model(), _model()
    for step in range(3):
        _direct_step(direct, _requests(step), direct=True)
        _direct_step(autograd, _requests(step), direct=False)
    for p, q in zip(_grads(direct), _grads(autograd)):
        assert torch.equal(p, q)
