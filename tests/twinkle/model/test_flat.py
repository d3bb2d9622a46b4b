"""A tenant's weights, gradients and Adam state in one buffer per kind (twinkle/model/flat.py)."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel, multi_step


def _model(names=("a", "b"), flat=True, **optimizer_kwargs) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel("tiny://qwen3")
    for i, name in enumerate(names):
        rank = 8 * (i + 1)
        model.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        )
        model.set_optimizer("AdamW", adapter_name=name, lr=1e-2, **optimizer_kwargs)
        if not flat:
            model.tenants[name].flat = None
    return model


def _train(model, names, steps, seed=0):
    for step in range(steps):
        model.forward_backward_many(
            {
                n: {"inputs": make_batch(rows=2, seq=12, seed=seed + 10 * step + i)}
                for i, n in enumerate(names)
            }
        )
        model.clip_grad_and_step_many(list(names), max_grad_norm=0.5)


def _assert_same_tenant(a, b, name, atol=1e-6):
    """Weights and Adam state equal; ``atol`` > 1e-6 where the clip norms are summed in another
    order (flat against per-tensor), which Adam magnifies where a gradient is near zero."""
    for key, value in b.adapter_state_dict(name).items():
        torch.testing.assert_close(a.adapter_state_dict(name)[key], value, rtol=1e-5, atol=atol)
    state_a = a.tenants[name].optimizer.state_dict()["state"]
    state_b = b.tenants[name].optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for index, fields in state_b.items():
        for field, value in fields.items():
            torch.testing.assert_close(
                state_a[index][field], value, rtol=1e-4, atol=1e-8 if atol <= 1e-6 else 1e-7
            )


def test_weights_grads_and_adam_state_are_views_of_one_buffer_each():
    model = _model()
    tenant = model.tenants["a"]
    flat = tenant.flat
    assert flat.param.numel() == sum(p.numel() for p in tenant.params)
    storage = flat.param.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == storage for p in tenant.params)
    with torch.no_grad():
        flat.param.zero_()  # writing the buffer writes the modules' weights
    assert all(float(p.detach().abs().sum()) == 0.0 for p in tenant.params)

    model = _model()
    _train(model, ["a", "b"], steps=1)
    flat = model.tenants["a"].flat
    assert flat.owns_grads()
    grad_storage = flat.grad.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == grad_storage for p in flat.params)
    state = model.tenants["a"].optimizer.state
    first = flat.params[0]
    assert (
        state[first]["exp_avg"].untyped_storage().data_ptr()
        == flat.exp_avg.untyped_storage().data_ptr()
    )
    assert float(flat.exp_avg.abs().sum()) > 0  # the moments live in the buffer, and moved
    assert torch.equal(flat.steps, torch.ones_like(flat.steps))


def test_zero_grad_zeroes_the_buffer_in_place_and_keeps_the_views():
    model = _model(names=("a",))
    model.forward_backward(make_batch(rows=2, seq=12), adapter_name="a")
    flat = model.tenants["a"].flat
    views = [p.grad for p in flat.params]
    assert float(flat.grad.abs().sum()) > 0
    model.zero_grad(adapter_name="a")
    assert all(p.grad is v for p, v in zip(flat.params, views))
    assert float(flat.grad.abs().sum()) == 0.0
    assert not model.tenants["a"].pending_grads
    with pytest.raises(RuntimeError, match="no gradients"):
        model.clip_grad_norm(adapter_name="a")  # zero buffers are not "gradients to step with"


def test_flat_training_equals_torch_per_tensor_training():
    flat, reference = _model(), _model(flat=False)
    for model in (flat, reference):
        _train(model, ["a", "b"], steps=3)
    for name in ("a", "b"):
        _assert_same_tenant(flat, reference, name, atol=5e-6)
    assert flat.tenants["a"].flat is not None and reference.tenants["a"].flat is None


def test_gradients_set_from_elsewhere_are_adopted_into_a_fresh_buffer():
    model = _model(names=("a",))
    model.forward_backward(make_batch(rows=2, seq=12, seed=1), adapter_name="a")
    flat = model.tenants["a"].flat
    old_views = [p.grad for p in flat.params]
    kept = [v.clone() for v in old_views]
    foreign = [torch.full_like(p, 0.5) for p in flat.params]
    for p, g in zip(flat.params, foreign):
        p.grad = g  # e.g. a data-parallel reduction, or a resumed checkpoint's pending grads
    assert not flat.owns_grads()
    model.forward_backward(make_batch(rows=2, seq=12, seed=2), adapter_name="a")
    assert flat.owns_grads()
    # Whoever held the old views still sees their values; the new buffer holds foreign + new.
    for view, value in zip(old_views, kept):
        assert torch.equal(view, value)
    assert all(not torch.equal(p.grad, g) for p, g in zip(flat.params, foreign))
    reference = _model(names=("a",))
    for p, g in zip(reference.tenants["a"].params, foreign):
        p.grad = g.clone()
    reference.forward_backward(make_batch(rows=2, seq=12, seed=2), adapter_name="a")
    for p, q in zip(flat.params, reference.tenants["a"].params):
        torch.testing.assert_close(p.grad, q.grad)


def test_loaded_optimizer_state_is_adopted_and_training_continues_equal():
    straight, resumed = _model(), _model()
    _train(straight, ["a", "b"], steps=2)
    _train(resumed, ["a", "b"], steps=2)
    saved = resumed.tenants["a"].optimizer.state_dict()
    # A fresh optimizer loaded from the saved state (what resuming a checkpoint does).
    resumed.set_optimizer("AdamW", adapter_name="a", lr=1e-2)
    resumed.tenants["a"].optimizer.load_state_dict(saved)
    flat = resumed.tenants["a"].flat
    buffers = flat.adam_buffers(resumed.tenants["a"].optimizer)  # adopts the loaded state
    assert buffers is not None
    loaded = resumed.tenants["a"].optimizer.state_dict()["state"]
    expected = torch.cat([loaded[i]["exp_avg"].reshape(-1) for i in range(len(flat.params))])
    assert torch.equal(buffers[2], expected)
    _train(straight, ["a", "b"], steps=2, seed=100)
    _train(resumed, ["a", "b"], steps=2, seed=100)
    state = resumed.tenants["a"].optimizer.state
    first = flat.params[0]
    assert (
        state[first]["exp_avg"].untyped_storage().data_ptr()
        == flat.exp_avg.untyped_storage().data_ptr()
    )
    for name in ("a", "b"):
        _assert_same_tenant(resumed, straight, name)


def test_unequal_step_counts_fall_back_to_per_tensor_steps():
    model, reference = _model(names=("a",)), _model(names=("a",), flat=False)
    for m in (model, reference):
        _train(m, ["a"], steps=1)
        m.forward_backward(make_batch(rows=2, seq=12, seed=5), adapter_name="a")
        first = m.tenants["a"].params[0]
        # One weight has no gradient in this step: torch's step() skips it.
        m.tenants["a"].params[0].grad = None
        m.step(adapter_name="a")
        m.zero_grad(adapter_name="a")
        assert int(m.tenants["a"].optimizer.state[first]["step"]) == 1
    flat = model.tenants["a"].flat
    model.forward_backward(make_batch(rows=2, seq=12, seed=6), adapter_name="a")
    assert flat.adam_buffers(model.tenants["a"].optimizer) is None  # steps 1 and 2: not flat
    reference.forward_backward(make_batch(rows=2, seq=12, seed=6), adapter_name="a")
    model.clip_grad_and_step(max_grad_norm=0.5, adapter_name="a")
    reference.clip_grad_and_step(max_grad_norm=0.5, adapter_name="a")
    _assert_same_tenant(model, reference, "a", atol=5e-6)


def test_flat_tenants_share_one_kernel_even_with_other_optimizers():
    model = _model(names=("a", "b", "c"))
    model.set_optimizer("SGD", adapter_name="c", lr=0.1)
    model.forward_backward_many(
        {n: {"inputs": make_batch(rows=1, seq=8, seed=i)} for i, n in enumerate("abc")}
    )
    tenants = [model.tenants[n] for n in "abc"]
    launches = multi_step.optimizer_steps([t.optimizer for t in tenants], [t.flat for t in tenants])
    assert launches == 1
    assert all(torch.equal(t.flat.steps, torch.ones_like(t.flat.steps)) for t in tenants[:2])
    assert tenants[2].flat.steps is None  # SGD never lays out Adam state
