"""Real model shapes: the fused step at Qwen3's real vocabulary (151,936 rows).

- logits-free log-probs (``linear_logprobs``) give the materialised path's losses, accuracy and
  gradients within 1e-5, for SFT, GRPO and DPO (with its reference pass) tenants fused in a pass;
- fused == separate with logits-free log-probs;
- decoder-layer recompute gives bit-identical gradients, replays LoRA dropout, and ``auto`` turns
  it on only for a pass over the budget;
- a row that cannot fit the memory is refused before any work, with the tokens that fit.
"""

import numpy as np
import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from tests.twinkle.model.test_fused import assert_rel_close
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.step import fused as fused_module
from twinkle.model.step.passes import linear_head
from twinkle.model.step.plan import ModelShape, head_chunk_bytes

MODEL = "tiny://qwen3-vocab"
VOCAB = 151_936
LOSSES = {"sft": None, "grpo": ("GRPOLoss", {"epsilon": 0.2}), "dpo": ("DPOLoss", {"beta": 0.1})}


def _model(dropout=0.0, **options):
    m = MultiLoraTransformersModel(MODEL, options=options)
    for i, (name, loss) in enumerate(LOSSES.items()):
        config = LoraConfig(
            r=4 * (i + 1), lora_alpha=8, lora_dropout=dropout, init_lora_weights=False
        )
        m.add_adapter_to_model(name, config)
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
        if loss is not None:
            m.set_loss(loss[0], adapter_name=name, **loss[1])
    return m


def _requests():
    g = torch.Generator().manual_seed(7)
    return {
        "sft": {"inputs": make_batch(rows=2, seq=24, seed=1, vocab=VOCAB)},
        "grpo": {
            "inputs": make_batch(rows=4, seq=20, seed=2, vocab=VOCAB),
            "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0]),
            "old_logprobs": -11.9 + 0.05 * torch.randn(4, 20, generator=g),
        },
        "dpo": {"inputs": make_batch(rows=4, seq=16, seed=3, vocab=VOCAB)},
    }


def _grads(m, name):
    return [p.grad.clone() for p in m.tenants[name].params]


def test_the_tiny_real_vocab_model_has_a_plain_linear_head():
    m = MultiLoraTransformersModel(MODEL)
    assert m.model.get_input_embeddings().weight.shape[0] == VOCAB
    assert linear_head(m.model) is m.model.lm_head.weight


def test_logits_free_equals_materialised_logits_at_a_real_vocabulary():
    free, materialised = _model(), _model(linear_logprobs=False)
    out_free = free.forward_backward_many(_requests())
    out_mat = materialised.forward_backward_many(_requests())
    for name in LOSSES:
        assert out_free[name]["loss"] == pytest.approx(out_mat[name]["loss"], rel=1e-5)
        for a, b in zip(out_free[name]["logprobs"], out_mat[name]["logprobs"]):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-5)
        for g_free, g_mat in zip(_grads(free, name), _grads(materialised, name)):
            assert_rel_close(g_free, g_mat)
    metrics_free = free.calculate_metric(is_training=True, adapter_name="sft").result
    metrics_mat = materialised.calculate_metric(is_training=True, adapter_name="sft").result
    assert metrics_free.keys() == metrics_mat.keys() and metrics_free
    for key, value in metrics_mat.items():
        assert metrics_free[key] == pytest.approx(value, rel=1e-5), key


def test_grpo_metric_entropy_is_the_same_with_and_without_logits():
    values = []
    for options in ({}, {"linear_logprobs": False}):
        m = _model(**options)
        m.add_metric("GRPOMetric", is_training=True, adapter_name="grpo")
        request = _requests()["grpo"]
        m.forward_backward(request.pop("inputs"), adapter_name="grpo", **request)
        values.append(m.calculate_metric(is_training=True, adapter_name="grpo").result)
    assert values[0]["train/entropy"] > 1.0  # a random model's distribution is wide
    assert values[0]["train/entropy"] == pytest.approx(values[1]["train/entropy"], rel=1e-5)


def test_logits_free_forward_only_equals_materialised():
    free, materialised = _model(), _model(linear_logprobs=False)
    batch = make_batch(rows=3, seq=18, seed=9, vocab=VOCAB)
    a = free.forward_only(batch, adapter_name="sft")
    b = materialised.forward_only(batch, adapter_name="sft")
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for x, y in zip(a["logprobs"], b["logprobs"]):
        torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=1e-5, atol=1e-5)


def test_fused_equals_separate_with_logits_free_logprobs():
    fused, separate = _model(), _model()
    out_fused = fused.forward_backward_many(_requests())
    for name, request in _requests().items():
        request = dict(request)
        out = separate.forward_backward(request.pop("inputs"), adapter_name=name, **request)
        assert out_fused[name]["loss"] == pytest.approx(out["loss"], rel=1e-5)
        for g_fused, g_sep in zip(_grads(fused, name), _grads(separate, name)):
            assert_rel_close(g_fused, g_sep)


def _step_grads(m):
    m.forward_backward_many(_requests())
    return {name: _grads(m, name) for name in LOSSES}


def test_recompute_is_bit_identical_and_replays_lora_dropout():
    """With dropout 0.3 the recomputed layers must draw the forward's masks again: a different
    mask would change the gradients. Two runs with recompute are bit-identical too."""
    torch.manual_seed(0)
    plain = _step_grads(_model(dropout=0.3, activation_recompute="off"))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        m = _model(dropout=0.3, activation_recompute="on")
        runs.append(_step_grads(m))
    for name in LOSSES:
        for p, r1, r2 in zip(plain[name], runs[0][name], runs[1][name]):
            assert torch.equal(r1, r2)
            assert torch.equal(p, r1)


def test_recompute_keeps_fewer_tensors():
    """A pass with recompute saves only the decoder layers' inputs for the backward (the
    checkpoint keeps what the layers save to itself; the weights are not counted)."""
    saved = {}
    for mode in ("off", "on"):
        m = _model(activation_recompute=mode)
        weights = {p.untyped_storage().data_ptr() for p in m.model.parameters()}
        storages = {}

        def pack(t, storages=storages, weights=weights):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights:
                storages[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.forward_backward_many(_requests())
        saved[mode] = sum(storages.values())
    assert saved["on"] < 0.5 * saved["off"], saved


def test_auto_recomputes_only_the_pass_over_the_budget():
    m = _model(activation_recompute="auto", max_pass_tokens=64)
    seen = []
    layer = m.model.model.layers[0]
    layer.register_forward_pre_hook(lambda *_: seen.append(m.recompute.active))
    small = {"sft": {"inputs": make_batch(rows=2, seq=24, seed=1, vocab=VOCAB)}}
    m.forward_backward_many(small)  # 48 tokens: within the budget
    assert seen == [False]
    seen.clear()
    long_row = {"sft": {"inputs": make_batch(rows=1, seq=96, seed=2, vocab=VOCAB)}}
    m.forward_backward_many(long_row)  # one 96-token row cannot be cut: recomputed
    assert seen == [True]
    assert m.recompute.active is False  # only for that pass


def test_a_row_that_fits_no_memory_is_refused_before_any_work(monkeypatch):
    m = _model(activation_recompute="auto")
    # Room for half the row with recompute, in the step's own accounting (the head's tile too).
    shape = ModelShape.of(m.model)
    fixed = head_chunk_bytes(m.options.linear_chunk_bytes, shape.dtype_bytes)
    limit = fixed + shape.pass_bytes(1, 2048, logits_free=True, recompute=True)
    monkeypatch.setattr(fused_module, "memory_limit_bytes", lambda *_: limit)
    calls = []
    m.model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    request = {"sft": {"inputs": make_batch(rows=1, seq=4096, seed=3, vocab=VOCAB)}}
    with pytest.raises(InvalidArgumentError) as info:
        m.forward_backward_many(request)
    message = str(info.value)
    assert "a row of 4096 tokens" in message and "with activation recompute" in message
    assert "tokens fit in one pass" in message and "max_length" in message
    assert calls == [] and not m.tenants["sft"].pending_grads
    # Without recompute the advice is to turn it on.
    off = _model(activation_recompute="off")
    with pytest.raises(InvalidArgumentError, match="turn on activation_recompute"):
        off.forward_backward_many(request)


def test_sampler_prompt_logprobs_are_logits_free_and_equal_the_logits():
    """The torch sampler's prompt log-probs (and the tokens it then samples) at a real vocabulary:
    from the hidden states and the head, equal to the materialised logits' within 1e-5."""
    from twinkle.sampler import TorchSampler

    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(10, VOCAB, (n,), generator=g).tolist() for n in (9, 14)]
    params = {"max_tokens": 3, "seed": 5, "prompt_logprobs": True}
    free = TorchSampler(MODEL)
    materialised = TorchSampler(MODEL, options={"linear_logprobs": False})
    calls = []
    free.model.lm_head.register_forward_hook(lambda mod, args, out: calls.append(out.shape[1]))
    got = free.sample(prompts, params)
    want = materialised.sample(prompts, params)
    assert calls[0] == 1  # the prefill applied the head to the last position only
    for a, b in zip(got, want):
        assert a.prompt_logprobs[0] is None and b.prompt_logprobs[0] is None
        np.testing.assert_allclose(
            a.prompt_logprobs[1:], b.prompt_logprobs[1:], rtol=1e-5, atol=1e-5
        )
        assert a.sequences[0].tokens == b.sequences[0].tokens
        np.testing.assert_allclose(a.sequences[0].logprobs, b.sequences[0].logprobs, atol=1e-5)
