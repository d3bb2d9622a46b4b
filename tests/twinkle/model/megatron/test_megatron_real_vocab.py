"""The megatron backend at Qwen3's real vocabulary (151,936 rows), tensor parallel 1.

- logits-free log-probs (``linear_logprobs``): the output layer is never applied to the pass's
  tokens, and losses, log-probs and LoRA gradients (``lm_head`` adapters included) equal the
  materialised logits' within 1e-5, for tied and untied heads, SFT and DPO (its reference pass)
  tenants fused in one pass;
- megatron-core's activation recompute (``activation_recompute``): two tenants fused in one pass,
  LoRA dropout on, give bit-identical losses and gradients with and without it and across runs,
  fused == separate with it on, and ``auto`` turns it on only for a pass over the budget.
"""

import json
import shutil

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from tests.twinkle.model.test_fused import assert_rel_close  # noqa: E402
from twinkle.model.step.passes import linear_head  # noqa: E402

MODEL = "tiny://qwen3-vocab"
VOCAB = 151_936
#: name: (rank, seed, target_modules, loss)
TENANTS = {
    "sft": (4, 1, "all-linear", None),
    "dpo": (8, 2, ["q_proj", "v_proj", "down_proj", "lm_head"], ("DPOLoss", {"beta": 0.1})),
}


def _batch(rows, seq, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, VOCAB, (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _requests():
    padded = _batch(4, 10, 2)  # DPO: (chosen, rejected) pairs; one padded row
    padded["attention_mask"][1, 7:] = 0
    padded["labels"][1, 7:] = -100
    return {"sft": {"inputs": _batch(3, 12, 1)}, "dpo": {"inputs": padded}}


def _model(model_id=MODEL, dropout=0.0, tenants=TENANTS, **options):
    from twinkle.model.megatron import MultiLoraMegatronModel

    m = MultiLoraMegatronModel(model_id, options=options)
    for name, (r, seed, targets, loss) in tenants.items():
        config = {
            "r": r,
            "lora_alpha": 2 * r,
            "lora_dropout": dropout,
            "target_modules": targets,
            "init_lora_weights": False,  # B non-zero: every LoRA weight gets a gradient
        }
        m.add_adapter_to_model(name, config, seed=seed)
        m.set_optimizer("Adam", adapter_name=name, lr=1e-2)
        if loss is not None:
            m.set_loss(loss[0], adapter_name=name, **loss[1])
    return m


def _grads(m, name):
    return [p.grad.clone() for p in m.tenants[name].params]


def _assert_logits_free_equals_materialised(model_id):
    free, materialised = _model(model_id), _model(model_id, linear_logprobs=False)
    head_calls = []
    free.model.gpt.output_layer.base.register_forward_hook(lambda *_: head_calls.append(1))
    out_free = free.forward_backward_many(_requests())
    out_mat = materialised.forward_backward_many(_requests())
    assert head_calls == []  # no [tokens, vocab] logits in the logits-free step
    for name in TENANTS:
        assert out_free[name]["loss"] == pytest.approx(out_mat[name]["loss"], rel=1e-5)
        for a, b in zip(out_free[name]["logprobs"], out_mat[name]["logprobs"]):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-5)
        grads_free, grads_mat = _grads(free, name), _grads(materialised, name)
        assert len(grads_free) == len(grads_mat) > 0
        for g_free, g_mat in zip(grads_free, grads_mat):
            assert g_mat.norm() > 0
            assert_rel_close(g_free, g_mat)
    head_params = [n for n, _ in free.model.lm_head.named_parameters() if "dpo" in n]
    assert head_params  # the DPO tenant's lm_head adapter took part
    return free, materialised


def test_logits_free_equals_materialised_with_a_tied_head():
    free, materialised = _assert_logits_free_equals_materialised(MODEL)
    # Tied: the head is the input embedding; the materialised model keeps its logits.
    assert linear_head(free.model) is free.model.gpt.embedding.word_embeddings.weight
    assert free.model.gpt.embedding.word_embeddings.weight.shape == (VOCAB, 64)
    batch = _batch(3, 14, 9)
    a = free.forward_only(batch, adapter_name="sft")
    b = materialised.forward_only(batch, adapter_name="sft")
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for x, y in zip(a["logprobs"], b["logprobs"]):
        torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=1e-5, atol=1e-5)


def test_logits_free_equals_materialised_with_an_untied_head(tmp_path):
    from twinkle.hub import resolve_model_dir

    source = resolve_model_dir(MODEL)
    untied = tmp_path / "untied"
    shutil.copytree(source, untied)
    config = json.loads((untied / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(config))
    weights = load_file(str(untied / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    weights["lm_head.weight"] = 0.1 * torch.randn(VOCAB, 64, generator=g)
    save_file(weights, str(untied / "model.safetensors"))
    free, _ = _assert_logits_free_equals_materialised(str(untied))
    assert not free.model.gpt.share_embeddings_and_output_weights
    head = linear_head(free.model)
    assert head is free.model.gpt.output_layer.base.weight
    torch.testing.assert_close(head, weights["lm_head.weight"], rtol=0, atol=0)


def _recompute_run(mode, dropout=0.3):
    torch.manual_seed(0)  # LoRA dropout draws from the default generator
    m = _model(dropout=dropout, activation_recompute=mode)
    runs = []  # grad mode of each decoder layer 0 call (its rerun in the backward: True)
    m.model.gpt.decoder.layers[0].register_forward_pre_hook(
        lambda *_: runs.append(torch.is_grad_enabled())
    )
    out = m.forward_backward_many(_requests())
    return out, {name: _grads(m, name) for name in TENANTS}, runs


def test_recompute_is_bit_identical_and_replays_routes_and_dropout():
    """Two tenants fused, dropout 0.3: the rerun in the backward must send each row through its
    tenant's adapter with the forward's dropout masks, or the gradients would differ."""
    out_off, grads_off, runs_off = _recompute_run("off")
    out_on, grads_on, runs_on = _recompute_run("on")
    out_again, grads_again, _ = _recompute_run("on")
    # Without recompute the layer runs once per pass with a graph; with it the checkpoint runs
    # it without one, then again inside the backward. (DPO's reference pass: no graph, once.)
    assert runs_off.count(True) == 1 and runs_on.count(True) == 1
    assert runs_on.count(False) == runs_off.count(False) + 1
    for name in TENANTS:
        assert out_on[name]["loss"] == out_off[name]["loss"] == out_again[name]["loss"]
        for g_off, g_on, g_again in zip(grads_off[name], grads_on[name], grads_again[name]):
            assert g_off.norm() > 0
            assert torch.equal(g_on, g_off)
            assert torch.equal(g_on, g_again)


def test_fused_equals_separate_with_recompute():
    fused = _model(activation_recompute="on")
    separate = _model(activation_recompute="on")
    out_fused = fused.forward_backward_many(_requests())
    for name, request in _requests().items():
        out = separate.forward_backward(request["inputs"], adapter_name=name)
        assert out_fused[name]["loss"] == pytest.approx(out["loss"], rel=1e-5)
        for g_fused, g_sep in zip(_grads(fused, name), _grads(separate, name)):
            assert_rel_close(g_fused, g_sep)


def test_auto_recomputes_only_the_pass_over_the_budget():
    m = _model(tenants={"sft": TENANTS["sft"]}, activation_recompute="auto", max_pass_tokens=64)
    decoder = m.model.gpt.decoder
    seen = []  # (graph, block in training mode: megatron's recompute path) per layer 0 call
    decoder.layers[0].register_forward_pre_hook(
        lambda *_: seen.append((torch.is_grad_enabled(), decoder.training))
    )
    m.forward_backward_many({"sft": {"inputs": _batch(2, 24, 1)}})  # 48 tokens: within
    assert seen == [(True, False)]
    seen.clear()
    m.forward_backward_many({"sft": {"inputs": _batch(1, 96, 2)}})  # one uncuttable 96-token row
    assert seen == [(False, True), (True, False)]  # the checkpoint's run, its rerun (backward)
    assert m.recompute.active is False and decoder.training is False  # only for that pass


def test_off_builds_no_recompute():
    m = _model(tenants={}, activation_recompute="off")
    assert m.recompute is None
    assert m.model.gpt.config.recompute_granularity is None
    on = _model(tenants={}, activation_recompute="on")
    config = on.model.gpt.config
    assert (config.recompute_granularity, config.recompute_method) == ("full", "uniform")
    assert config.recompute_num_layers == 1
    assert on.recompute.layers == ["decoder.layers.0", "decoder.layers.1"]
