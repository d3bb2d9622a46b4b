"""The training step's direct weight gradients (``LoraRouter.direct_weight_grads``) in the
model: used once a tenant's flat gradient buffer is in place, bit-identical to autograd's
accumulation, and left to autograd where a weight has a gradient hook.

The bit-equality test runs on both kernels: the torch path, and the Triton path (compiled on
CUDA; in the Triton interpreter on the CPU, where the layers are pointed at it directly)."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.lora import MultiLoraLinear, direct_grads, layer, ops
from twinkle.model.options import ExecutionOptions

NAMES = ("a", "b", "c")


def _model(direct_weight_grads: bool = True) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(
        "tiny://qwen3", options=ExecutionOptions(direct_weight_grads=direct_weight_grads)
    )
    for i, name in enumerate(NAMES):
        rank = 8 * 2**i
        config = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        model.add_adapter_to_model(name, config)
        model.set_optimizer("AdamW", adapter_name=name, lr=1e-2)
    model.set_loss("GRPOLoss", adapter_name="b")
    return model


def _requests(step: int) -> dict:
    requests = {
        n: {"inputs": make_batch(rows=2, seq=12, seed=10 * step + i)} for i, n in enumerate(NAMES)
    }
    requests["b"]["advantages"] = [1.0, -0.5]
    return requests


def _count_direct_adds(monkeypatch) -> list:
    calls = []
    original = direct_grads.add_weight_grads

    def spy(weights, grads):
        calls.append(len(weights))
        original(weights, grads)

    monkeypatch.setattr(direct_grads, "add_weight_grads", spy)
    return calls


def _train(model, steps: int) -> list[dict]:
    results = []
    for step in range(steps):
        results.append(model.forward_backward_many(_requests(step)))
        if step % 2 == 1:  # every other call steps: gradients accumulate over two passes
            model.clip_grad_and_step_many(list(NAMES))
    return results


@pytest.fixture(params=["torch", "triton"])
def kernel(request, monkeypatch):
    """The multi-LoRA kernel every adapted layer uses in the test."""
    if request.param == "torch":

        def op(x, segments, out_features, plan=None, *, kernel, anchor):
            return ops.segmented_lora(
                x, segments, out_features, plan, kernel="torch", anchor=anchor
            )

    else:
        pytest.importorskip("triton")
        from twinkle.model.lora import triton_kernel

        if not torch.cuda.is_available():  # the CPU path would never pick Triton: point at it
            monkeypatch.setenv("TRITON_INTERPRET", "1")

        def op(x, segments, out_features, plan=None, *, kernel, anchor):
            return triton_kernel.segmented_lora_triton(x, segments, out_features, anchor=anchor)

    monkeypatch.setattr(layer, "segmented_lora", op)
    return request.param


def test_direct_steps_equal_autograd_accumulation_bit_for_bit(monkeypatch, kernel):
    calls = _count_direct_adds(monkeypatch)
    direct = _model()
    direct_results = _train(direct, 5)
    # The first pass has no gradient buffers yet (autograd); each of the 4 later ones adds
    # directly, once per adapted linear, every tenant's A and B in that one call.
    layers = sum(isinstance(m, MultiLoraLinear) for m in direct.model.modules())
    assert layers > 0 and calls == [2 * len(NAMES)] * (4 * layers)
    calls.clear()
    plain = _model(direct_weight_grads=False)
    plain_results = _train(plain, 5)
    assert calls == []
    for got, want in zip(direct_results, plain_results):
        assert {n: r["loss"] for n, r in got.items()} == {n: r["loss"] for n, r in want.items()}
    for name in NAMES:
        for p, q in zip(direct.tenants[name].params, plain.tenants[name].params):
            assert torch.equal(p.grad, q.grad)
            assert torch.equal(p.detach(), q.detach())


def test_a_gradient_hook_sends_the_step_back_to_autograd(monkeypatch):
    model = _model()
    _train(model, 1)  # gradient buffers in place
    seen = []
    model.tenants["c"].params[0].register_hook(lambda g: seen.append(g.clone()))
    calls = _count_direct_adds(monkeypatch)
    model.forward_backward_many(_requests(1))
    assert calls == []  # autograd's accumulation, which runs hooks
    assert len(seen) == 1


def test_a_failing_request_after_direct_steps_leaves_gradients_as_they_were():
    model = _model()
    _train(model, 1)
    before = {n: [p.grad.clone() for p in model.tenants[n].params] for n in NAMES}
    requests = _requests(1)
    # DPO needs row pairs: 3 rows fail in the loss, after the fused forward has run.
    requests["b"] = {"inputs": make_batch(rows=3, seq=12), "loss": {"name": "DPOLoss", "beta": 0.1}}
    with pytest.raises(ValueError, match="pair|even"):
        model.forward_backward_many(requests)
    for name in NAMES:
        for p, g in zip(model.tenants[name].params, before[name]):
            assert torch.equal(p.grad, g)


def test_a_frozen_weight_sends_the_step_back_to_autograd(monkeypatch):
    model = _model()
    _train(model, 1)
    frozen = model.tenants["a"].params[0]
    frozen.requires_grad_(False)
    before = frozen.grad.clone()
    trained = model.tenants["a"].params[1]
    trained_before = trained.grad.clone()
    calls = _count_direct_adds(monkeypatch)
    model.forward_backward_many(_requests(1))
    assert calls == []
    assert torch.equal(frozen.grad, before)  # autograd leaves a frozen weight alone
    assert not torch.equal(trained.grad, trained_before)  # and accumulates into the others
