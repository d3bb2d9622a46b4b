"""forward_backward_many: one base pass for several tenants equals separate per-tenant passes."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel

RANKS = {"sft8": 8, "grpo16": 16, "sft32": 32}


def _model(model_id):
    m = MultiLoraTransformersModel(model_id)
    for name, rank in RANKS.items():
        m.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        )
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    m.set_loss("GRPOLoss", adapter_name="grpo16", epsilon=0.2, beta=0.05)
    return m


def _requests():
    grpo_batch = make_batch(rows=4, seq=20, seed=2)
    return {
        "sft8": {"inputs": make_batch(rows=2, seq=24, seed=1)},
        "grpo16": {
            "inputs": grpo_batch,
            "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0]),
            "old_logprobs": -8.3
            + 0.05 * torch.randn(4, 20, generator=torch.Generator().manual_seed(5)),
        },
        "sft32": {"inputs": make_batch(rows=3, seq=16, seed=3)},
    }


def assert_rel_close(actual, expected, rel=1e-5):
    """Equal within ``rel`` of the expected tensor's norm: the fused pass sums some terms in
    another order (the GRPO tenant's, a few 1e-7 apart on some CPUs), which an element-wise
    tolerance would charge to the entries that are nearly zero."""
    diff = (actual - expected).norm().item()
    assert diff <= rel * max(expected.norm().item(), 1e-12), (diff, expected.norm().item())


def _grads(model, name):
    return [p.grad.clone() for p in model.tenants[name].params]


@pytest.mark.parametrize("model_id", ["tiny://qwen3", "tiny://qwen3.5"])
def test_fused_step_equals_separate_steps(model_id):
    fused, separate = _model(model_id), _model(model_id)
    fused_out = fused.forward_backward_many(_requests())
    separate_out = {}
    for name, request in _requests().items():
        request = dict(request)
        separate_out[name] = separate.forward_backward(
            request.pop("inputs"), adapter_name=name, **request
        )
    for name in RANKS:
        assert fused_out[name]["loss"] == pytest.approx(separate_out[name]["loss"], rel=1e-5)
        for g_fused, g_sep in zip(_grads(fused, name), _grads(separate, name)):
            assert_rel_close(g_fused, g_sep)
        fused.clip_grad_and_step(adapter_name=name)
        separate.clip_grad_and_step(adapter_name=name)
        after_fused, after_sep = fused.adapter_state_dict(name), separate.adapter_state_dict(name)
        for key in after_fused:
            assert_rel_close(after_fused[key], after_sep[key])


def test_fused_keeps_per_tenant_accumulation():
    m = _model("tiny://qwen3")
    m.tenants["sft8"].gradient_accumulation_steps = 2
    m.forward_backward_many(_requests())
    assert m.clip_grad_and_step(adapter_name="sft8") is False
    assert m.clip_grad_and_step(adapter_name="sft32") is True
    assert m.calculate_metric(adapter_name="sft8").result["step"] == 0


def test_fused_rejects_unknown_tenant_without_side_effects():
    m = _model("tiny://qwen3")
    requests = _requests()
    requests["ghost"] = {"inputs": make_batch()}
    with pytest.raises(ValueError, match="ghost"):
        m.forward_backward_many(requests)
    assert all(p.grad is None for t in m.tenants.values() for p in t.params)


def test_fused_token_accuracy_counts_each_tenants_own_rows():
    """Labels are built from each tenant's own predictions (a known number right), with different
    row counts and lengths (padding in the stacked batch): every tenant's ``token_acc`` after one
    fused pass is exactly its known count over its trained tokens."""
    from twinkle.model.lora.layer import RowRoute

    m = _model("tiny://qwen3")
    requests, expected = {}, {}
    for i, (name, (rows, seq)) in enumerate(zip(RANKS, [(2, 24), (4, 20), (3, 16)])):
        batch = make_batch(rows=rows, seq=seq, seed=10 + i)
        with torch.no_grad(), m.routes([RowRoute(name, 0, rows)]):
            predicted = m.model(input_ids=batch["input_ids"]).logits.argmax(-1)[:, :-1]
        right = torch.rand(rows, seq - 1, generator=torch.Generator().manual_seed(i)) < 0.5
        vocab = m.model.get_input_embeddings().weight.shape[0]
        labels = torch.where(right, predicted, (predicted + 1) % vocab)
        batch["labels"][:, 1:] = labels
        batch["labels"][:, :4] = -100  # prompt positions: never counted
        trained = batch["labels"][:, 1:] != -100
        expected[name] = int((right & trained).sum()) / int(trained.sum())
        requests[name] = {"inputs": batch}
    requests["grpo16"]["advantages"] = torch.tensor([1.0, -0.5, 0.25, -1.0])
    m.forward_backward_many(requests)
    for name, accuracy in expected.items():
        assert 0.2 < accuracy < 0.8
        assert m.calculate_metric(adapter_name=name).result["token_acc"] == accuracy


@pytest.mark.parametrize("budget,expected", [(None, [2]), (48, [1, 2, 1])])
def test_interleaved_ranks_run_side_by_side_and_stay_exact(monkeypatch, budget, expected):
    """Tenants of ranks 8/16/8/16/8/16 (requested interleaved) are packed sorted by rank: in one
    pass each layer call runs two groups (one bmm each); with a budget of two tenants a pass the
    passes are (8, 8), (8, 16), (16, 16). Every tenant's loss and gradients are still those of
    its own pass."""
    from twinkle.model.lora import torch_kernel

    ranks = {f"t{i}": (8, 16)[i % 2] for i in range(6)}

    def build():
        m = MultiLoraTransformersModel("tiny://qwen3", options={"max_pass_tokens": budget})
        for name, rank in ranks.items():
            m.add_adapter_to_model(
                name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
            )
        return m

    requests = {n: {"inputs": make_batch(rows=2, seq=12, seed=i)} for i, n in enumerate(ranks)}
    fused, separate = build(), build()
    groups: list[int] = []
    real_build = torch_kernel.Plan.build

    def record(segments, *args, **kwargs):
        plan = real_build(segments, *args, **kwargs)
        groups.append(len(plan.groups))
        return plan

    monkeypatch.setattr(torch_kernel.Plan, "build", staticmethod(record))
    out = fused.forward_backward_many(requests)
    # One layer call per adapted linear per pass: the passes' group counts, in order.
    per_pass = len(groups) // len(expected)
    passes = [groups[i * per_pass : (i + 1) * per_pass] for i in range(len(expected))]
    assert [set(counts) for counts in passes] == [{n} for n in expected]
    monkeypatch.undo()
    for name, request in requests.items():
        alone = separate.forward_backward(request["inputs"], adapter_name=name)
        assert out[name]["loss"] == pytest.approx(alone["loss"], rel=1e-5)
        for g_fused, g_sep in zip(_grads(fused, name), _grads(separate, name)):
            torch.testing.assert_close(g_fused, g_sep, rtol=1e-5, atol=1e-8)
