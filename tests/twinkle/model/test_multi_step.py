"""clip_grad_and_step_many: one batched optimizer step for several tenants equals their own steps."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel, multi_step

# name -> (rank, optimizer, optimizer kwargs, scheduler or None, accumulation steps)
TENANTS = {
    "adamw8": (8, "AdamW", {"lr": 1e-2}, None, 1),
    "adamw16": (16, "AdamW", {"lr": 1e-2}, ("LinearLR", {"total_iters": 5}), 1),
    "adamw32": (32, "AdamW", {"lr": 1e-2}, None, 1),
    "adam_wd": (16, "Adam", {"lr": 3e-3, "weight_decay": 0.1}, None, 1),
    "adamw_lr": (8, "AdamW", {"lr": 5e-3, "betas": (0.8, 0.99)}, None, 1),
    "sgd": (8, "SGD", {"lr": 0.1, "momentum": 0.9}, None, 1),
    "accum2": (16, "AdamW", {"lr": 1e-2}, None, 2),
    "amsgrad": (8, "AdamW", {"lr": 1e-2, "amsgrad": True}, None, 1),  # steps tensor by tensor
}


def _model(flat: bool = True) -> MultiLoraTransformersModel:
    """Every tenant of TENANTS; ``flat=False`` turns the flat buffers off (torch's per-tensor
    clip and ``optimizer.step()``: the reference)."""
    model = MultiLoraTransformersModel("tiny://qwen3")
    for name, (rank, optimizer, kwargs, scheduler, accumulation) in TENANTS.items():
        model.add_adapter_to_model(
            name,
            LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False),
            gradient_accumulation_steps=accumulation,
        )
        model.set_optimizer(optimizer, adapter_name=name, **kwargs)
        if scheduler is not None:
            model.set_lr_scheduler(scheduler[0], adapter_name=name, **scheduler[1])
        if not flat:
            model.tenants[name].flat = None
    return model


def _backward(model: MultiLoraTransformersModel, step: int) -> None:
    for i, name in enumerate(TENANTS):
        model.forward_backward(make_batch(rows=2, seq=12, seed=100 * step + i), adapter_name=name)


def _optimizer_state(model, name):
    return model.tenants[name].optimizer.state_dict()["state"]


@pytest.mark.parametrize("alone_flat", [True, False], ids=["alone-flat", "alone-per-tensor"])
def test_many_equals_each_tenant_stepping_alone(alone_flat):
    """Batched (flat buffers, shared kernels) against each tenant's own step, flat or torch's
    per-tensor clip_grad_norm_ + optimizer.step()."""
    batched, alone = _model(), _model(flat=alone_flat)
    # max_grad_norm 0.05 makes every tenant clip, with its own coefficient.
    for step in range(3):
        _backward(batched, step)
        _backward(alone, step)
        stepped = batched.clip_grad_and_step_many(list(TENANTS), max_grad_norm=0.05)
        expected = {
            name: alone.clip_grad_and_step(max_grad_norm=0.05, adapter_name=name)
            for name in TENANTS
        }
        assert stepped == expected
        assert stepped["accum2"] is (step % 2 == 1)
        for name in TENANTS:
            a, b = batched.tenants[name], alone.tenants[name]
            assert (a.cur_step, a.micro_step, a.lr()) == (b.cur_step, b.micro_step, b.lr())
            if b.last_grad_norm is None:
                assert a.last_grad_norm is None
            else:
                assert a.last_grad_norm == pytest.approx(b.last_grad_norm, rel=1e-5)
            # Norms are summed in another order than torch's (last-ulp differences), which Adam
            # can magnify where a gradient is near zero: a few 1e-6 absolute on steps of lr 1e-2
            # (a flat buffer's norm is one reduction, torch's a norm of per-tensor norms).
            for key, value in alone.adapter_state_dict(name).items():
                torch.testing.assert_close(
                    batched.adapter_state_dict(name)[key],
                    value,
                    rtol=1e-5,
                    atol=1e-6 if alone_flat else 5e-6,
                )
            state_a, state_b = _optimizer_state(batched, name), _optimizer_state(alone, name)
            assert state_a.keys() == state_b.keys()
            for index in state_b:
                for field, value in state_b[index].items():
                    torch.testing.assert_close(state_a[index][field], value, rtol=1e-4, atol=1e-8)
    # The LinearLR tenant's schedule moved exactly as when it steps alone (checked above via lr()),
    # and the weights moved at all (a step that did nothing would also "match" a no-op).
    assert batched.tenants["adamw16"].lr() != pytest.approx(1e-2)
    fresh = _model()
    changed = [
        not torch.equal(value, batched.adapter_state_dict("adamw8")[key])
        for key, value in fresh.adapter_state_dict("adamw8").items()
    ]
    assert any(changed)


def test_same_hyperparameters_share_one_kernel():
    model = _model()
    _backward(model, 0)
    optimizers = [model.tenants[n].optimizer for n in ("adamw8", "adamw16", "adamw32", "sgd")]
    # adamw8/16/32 share lr, betas, eps, weight decay -> one fused launch; SGD steps on its own.
    assert multi_step.optimizer_steps(optimizers) == 1
    assert all(len(model.tenants[n].optimizer.state) for n in ("adamw8", "adamw16", "sgd"))


def test_clip_grad_norms_matches_torch_per_list():
    g = torch.Generator().manual_seed(0)
    grads = [[torch.randn(3, 4, generator=g) * s for _ in range(k)] for s, k in ((5, 2), (0.01, 3))]
    params = []  # the same gradients on parameters, for torch's clip_grad_norm_
    for tensors in grads:
        params.append([torch.nn.Parameter(torch.zeros(3, 4)) for _ in tensors])
        for p, t in zip(params[-1], tensors):
            p.grad = t.clone()
    expected = [float(torch.nn.utils.clip_grad_norm_(ps, 1.0)) for ps in params]
    norms = multi_step.clip_grad_norms(grads, 1.0)
    assert norms == pytest.approx(expected, rel=1e-6)
    assert norms[0] > 1.0 > norms[1]
    for tensors, ps in zip(grads, params):
        for t, p in zip(tensors, ps):
            torch.testing.assert_close(t, p.grad, rtol=1e-6, atol=0)
    # The large list was clipped to norm 1, the small one left alone.
    total = torch.linalg.vector_norm(torch.stack([t.norm() for t in grads[0]]))
    assert float(total) == pytest.approx(1.0, rel=1e-5)


def test_nothing_changes_when_one_tenant_has_no_gradients():
    model = _model()
    model.forward_backward(make_batch(rows=2, seq=12, seed=1), adapter_name="adamw8")
    before = model.adapter_state_dict("adamw8")
    with pytest.raises(RuntimeError, match="adamw16.*no gradients"):
        model.clip_grad_and_step_many(["adamw8", "adamw16"])
    assert model.tenants["adamw8"].micro_step == 0
    assert model.tenants["adamw8"].pending_grads
    for key, value in before.items():
        assert torch.equal(model.adapter_state_dict("adamw8")[key], value)
    with pytest.raises(ValueError, match="unknown adapter"):
        model.clip_grad_and_step_many(["adamw8", "nobody"])
    with pytest.raises(ValueError, match="repeat"):
        model.clip_grad_and_step_many(["adamw8", "adamw8"])
