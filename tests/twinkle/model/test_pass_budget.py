"""Adaptive fusion: a fused step packs tenants into passes by a token budget (and may cut one
tenant's rows into chunks); every split gives the gradients of separate per-tenant passes."""

import dataclasses

import numpy as np
import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.options import ExecutionOptions
from twinkle.model.step import plan as plan_mod
from twinkle.model.step.batch import collate

RANKS = {"sft8": 8, "grpo16": 16, "sft32": 32}
# Padded tokens: sft8 2 x 24 = 48, grpo16 4 x 20 = 80, sft32 3 x 16 = 48.
SPLITS = {
    # budget, split_batches -> what the plan must be (tenant, rows) per pass
    "one pass": (0, False, [[("sft8", 2), ("grpo16", 4), ("sft32", 3)]]),
    "two and one": (150, False, [[("sft8", 2), ("grpo16", 4)], [("sft32", 3)]]),
    "one each": (80, False, [[("sft8", 2)], [("grpo16", 4)], [("sft32", 3)]]),
    "all split": (
        40,
        True,
        [[("sft8", 1)], [("sft8", 1)], [("grpo16", 2)], [("grpo16", 2)]]
        + [[("sft32", 2)], [("sft32", 1)]],
    ),
    "mixed": (60, True, [[("sft8", 2)], [("grpo16", 3)], [("grpo16", 1)], [("sft32", 3)]]),
}


def _model(options=None):
    m = MultiLoraTransformersModel("tiny://qwen3", options=options)
    for name, rank in RANKS.items():
        m.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        )
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    m.set_loss("GRPOLoss", adapter_name="grpo16", epsilon=0.2, beta=0.05)
    return m


def _requests():
    return {
        "sft8": {"inputs": make_batch(rows=2, seq=24, seed=1)},
        "grpo16": {
            "inputs": make_batch(rows=4, seq=20, seed=2),
            "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0]),
            "old_logprobs": -8.3
            + 0.05 * torch.randn(4, 20, generator=torch.Generator().manual_seed(5)),
        },
        "sft32": {"inputs": make_batch(rows=3, seq=16, seed=3)},
    }


def _close(grads, reference):
    """Within 1e-5 relative, each tensor against its own scale (an element near zero differs by
    summation order only, ~1e-8 absolute)."""
    for g, ref in zip(grads, reference, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def _grads(model, name):
    return [p.grad.clone() for p in model.tenants[name].params]


@pytest.fixture(scope="module")
def separate():
    """Each tenant's own pass (no fusion): the reference every split must reproduce."""
    m = _model({"max_pass_tokens": 0})
    out = {}
    for name, request in _requests().items():
        request = dict(request)
        out[name] = m.forward_backward(request.pop("inputs"), adapter_name=name, **request)
    return out, {name: _grads(m, name) for name in RANKS}


@pytest.mark.parametrize("split", list(SPLITS))
def test_every_split_equals_separate_passes(split, separate, monkeypatch):
    budget, split_batches, expected = SPLITS[split]
    seen = []
    real_plan = plan_mod.plan_passes

    def spy(batches, max_tokens, splittable):
        passes = real_plan(batches, max_tokens, splittable)
        seen.extend([[(batches[p.index].tenant, p.stop - p.start) for p in ps] for ps in passes])
        return passes

    monkeypatch.setattr("twinkle.model.step.fused.plan_passes", spy)
    fused = _model({"max_pass_tokens": budget, "split_batches": split_batches})
    out = fused.forward_backward_many(_requests())
    assert seen == expected
    ref_out, ref_grads = separate
    for name in RANKS:
        assert out[name]["loss"] == pytest.approx(ref_out[name]["loss"], rel=1e-5)
        assert out[name]["num_tokens"] == ref_out[name]["num_tokens"]
        for a, b in zip(out[name]["logprobs"], ref_out[name]["logprobs"]):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=0)
        _close(_grads(fused, name), ref_grads[name])


def test_a_later_pass_that_fails_puts_every_gradient_back():
    """Budget 80: one pass per tenant. The last tenant's loss is NaN: the first two passes'
    gradients were added already, and must be gone again."""
    m = _model({"max_pass_tokens": 80})
    requests = _requests()
    bad = make_batch(rows=3, seq=16, seed=3)
    requests["sft32"] = {"inputs": bad}
    m.set_loss("GRPOLoss", adapter_name="sft32")
    requests["sft32"]["advantages"] = torch.tensor([float("nan"), 1.0, 1.0])
    with pytest.raises(InvalidArgumentError, match="sft32"):
        m.forward_backward_many(requests)
    for tenant in m.tenants.values():
        assert not tenant.pending_grads
        assert all(p.grad is None or not p.grad.any() for p in tenant.params)


def test_each_pass_releases_its_graph_before_the_next_pass(monkeypatch):
    """Budget 80: three passes. When a pass starts, the earlier passes' states hold values only
    (no autograd node): graphs kept to the step's end fragment the heap (fused.py, _drop_graph)."""
    import twinkle.model.step.fused as fused_mod

    real = fused_mod.forward_batches
    done, held = [], []

    def spy(*args, **kwargs):
        held.append(
            [s.logprobs.grad_fn is not None or s.loss_output.loss.grad_fn is not None for s in done]
        )
        states = real(*args, **kwargs)
        done.extend(states)
        return states

    monkeypatch.setattr(fused_mod, "forward_batches", spy)
    m = _model({"max_pass_tokens": 80})
    out = m.forward_backward_many(_requests())
    assert held == [[], [False], [False, False]]
    assert all(np.isfinite(out[name]["loss"]) for name in RANKS)


def test_a_split_tenant_keeps_gradient_accumulation():
    """Split over two passes twice (accumulation 2) equals one pass twice."""
    grads = {}
    for budget in (0, 24):
        m = _model({"max_pass_tokens": budget, "split_batches": True})
        m.tenants["sft8"].gradient_accumulation_steps = 2
        for _ in range(2):
            m.forward_backward(make_batch(rows=2, seq=24, seed=1), adapter_name="sft8")
        grads[budget] = _grads(m, "sft8")
    _close(grads[24], grads[0])


def test_dropout_and_images_keep_a_batch_whole():
    batch = collate(
        "t", make_batch(rows=4, seq=8), {}, template=None, processor=None, vocab_size=4000
    )
    assert plan_mod.can_split(batch, 0.0)
    assert not plan_mod.can_split(batch, 0.1)
    rope3 = {**batch.tensors, "position_ids": torch.zeros(3, 4, 8, dtype=torch.long)}
    assert not plan_mod.can_split(dataclasses.replace(batch, tensors=rope3), 0.0)
    passes = plan_mod.plan_passes([batch], 8, [False])
    assert [[(p.start, p.stop, p.whole) for p in ps] for ps in passes] == [[(0, 4, True)]]
    passes = plan_mod.plan_passes([batch], 16, [True])
    assert [[(p.start, p.stop) for p in ps] for ps in passes] == [[(0, 2)], [(2, 4)]]


def _configured(hidden, layers, vocab):
    module = torch.nn.Linear(2, 2)
    module.config = type(
        "C", (), {"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab}
    )
    return module


def test_cpu_budget_is_an_activation_memory_allowance():
    """On a CPU: the tokens whose activations fit 600 MiB, within [256, 2048]."""
    cpu = torch.device("cpu")
    bench_25m = _configured(512, 8, 4096)  # tiny://qwen3.5-25m's sizes
    assert plan_mod.activation_bytes_per_token(bench_25m) == 34 * 512 * 8 * 4 + 12 * 4096
    assert plan_mod.pass_token_budget(None, bench_25m, cpu) == (600 << 20) // 606208 == 1037
    assert plan_mod.pass_token_budget(None, _configured(1024, 28, 4096), cpu) == 256
    assert plan_mod.pass_token_budget(None, _configured(64, 2, 4096), cpu) == 2048
    assert plan_mod.pass_token_budget(512, bench_25m, cpu) == 512  # configured wins


def test_budget_defaults_and_validation():
    cpu = torch.device("cpu")
    module = torch.nn.Linear(2, 2)
    assert plan_mod.pass_token_budget(0, module, cpu) is None
    assert plan_mod.pass_token_budget(300, module, cpu) == 300
    assert ExecutionOptions(max_pass_tokens=0).max_pass_tokens == 0
    with pytest.raises(ValueError, match="max_pass_tokens"):
        ExecutionOptions(max_pass_tokens=-1)


def test_gpu_budget_comes_from_free_memory(monkeypatch):
    """On a GPU: half the free memory over the model's activation bytes per token, once."""
    calls = []

    def free(device):
        calls.append(device)
        return 8 << 30, 16 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", free)
    module = _configured(512, 8, 1000)
    per_token = 34 * 512 * 8 * 4 + 12 * 1000
    assert plan_mod.activation_bytes_per_token(module) == per_token
    cuda = torch.device("cuda", 0)
    expected = min(plan_mod.GPU_MAX_TOKENS, int((8 << 30) * 0.5 // per_token))
    assert plan_mod.pass_token_budget(None, module, cuda) == expected
    assert plan_mod.pass_token_budget(None, module, cuda) == expected
    assert len(calls) == 1
