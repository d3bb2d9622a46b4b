"""What ModelScope Twinkle's training scripts send reaches the loss: ``forward_only(disable_lora=
True)`` as a DPO reference through ``ref_outputs``, ``old_logps`` in the sampler's per-completion
form, ``task='embedding'`` batches, a teacher's top-k for GKD, and new losses fused with others."""

import numpy as np
import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from tests.twinkle.model.test_fused import assert_rel_close
from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.loss import InfonceLoss, LossInputs
from twinkle.model import MultiLoraTransformersModel

MODEL = "tiny://qwen3"


def _model(names=("a",), **losses):
    m = MultiLoraTransformersModel(MODEL)
    for i, name in enumerate(names):
        m.add_adapter_to_model(name, LoraConfig(r=4 + 4 * i, lora_alpha=8, init_lora_weights=False))
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    for name, (loss, kwargs) in losses.items():
        m.set_loss(loss, adapter_name=name, **kwargs)
    return m


def _grads(m, name):
    return [p.grad.clone() for p in m.tenants[name].params]


def _rows(batch):
    """A collated batch as a list of plain features, the form a script sends."""
    return [
        {"input_ids": ids.tolist(), "labels": labels.tolist()}
        for ids, labels in zip(batch["input_ids"], batch["labels"])
    ]


@pytest.fixture(scope="module")
def dpo_rows():
    return _rows(make_batch(rows=4, seq=12, seed=4))


def test_disable_lora_runs_the_base_model(dpo_rows):
    m = MultiLoraTransformersModel(MODEL)
    m.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=8))  # B = 0: starts as the base
    m.set_optimizer("AdamW", lr=5e-2)
    base = m.forward_only(dpo_rows, disable_lora=True)
    assert base.result is base and set(base) == {"logprobs", "num_tokens"}
    for _ in range(2):
        m.forward_backward(dpo_rows)
        m.clip_grad_and_step()
    adapted = m.forward_only(dpo_rows)
    again = m.forward_only(dpo_rows, disable_lora=True)
    for b, a, g in zip(base["logprobs"], adapted["logprobs"], again["logprobs"]):
        np.testing.assert_allclose(g, b, rtol=0, atol=1e-6)  # the base did not move
        assert np.abs(a - b).max() > 1e-3  # the adapter did
    assert m.calculate_metric(is_training=False).result["loss"] == pytest.approx(adapted["loss"])


def test_dpo_with_ref_outputs_equals_the_implicit_reference(dpo_rows):
    config = {"a": ("DPOLoss", {"beta": 0.1, "reference_free": False, "sft_weight": 1.0})}
    given, implicit = _model(**config), _model(**config)
    ref = given.forward_only(inputs=dpo_rows, disable_lora=True)
    out_given = given.forward_backward(inputs=dpo_rows, ref_outputs=ref.result)
    out_implicit = implicit.forward_backward(inputs=dpo_rows)
    assert out_given["loss"] == pytest.approx(out_implicit["loss"], rel=1e-5)
    for g1, g2 in zip(_grads(given, "a"), _grads(implicit, "a")):
        assert_rel_close(g1, g2)
    # Rows that do not match the inputs are the caller's mistake, named.
    with pytest.raises(InvalidArgumentError, match="ref_outputs"):
        given.forward_backward(inputs=dpo_rows, ref_outputs={"logprobs": ref["logprobs"][:2]})


def test_reference_free_dpo_runs_no_reference_pass(dpo_rows, monkeypatch):
    m = _model(a=("DPOLoss", {"reference_free": True}))
    calls = []
    decoder = m.model.model  # every pass runs it, with or without materialised logits
    original = decoder.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", counting)
    m.forward_backward(dpo_rows)
    assert len(calls) == 1


def test_user_mistakes_are_clear_errors(dpo_rows):
    m = _model(a=("GRPOLoss", {}))
    with pytest.raises(InvalidArgumentError, match="advantages"):
        m.forward_backward(dpo_rows)
    with pytest.raises(ArgumentTypeError, match="reference_fre"):
        m.set_loss("DPOLoss", reference_fre=False)
    with pytest.raises(InvalidArgumentError, match="disable_lora"):
        m.forward_backward(dpo_rows, advantages=[1.0] * 4, disable_lora=True)
    with pytest.raises(InvalidArgumentError, match="task"):
        m.forward_backward(dpo_rows, advantages=[1.0] * 4, task="embedding")
    assert not m.tenants["a"].pending_grads


def test_old_logps_per_completion_token_equal_old_logprobs_per_position(dpo_rows):
    per_position = [np.random.default_rng(i).normal(-3, 0.1, 12) for i in range(4)]
    trained = [(np.asarray(r["labels"]) != -100)[1:] for r in dpo_rows]
    completion = [p[1:][t] for p, t in zip(per_position, trained)]
    pairs = [[[(7, v)] for v in row] for row in completion]  # a sampler's (token, logprob)
    results = []
    for kwargs in (
        {"old_logprobs": per_position},
        {"old_logps": [list(r) for r in completion]},
        {"old_logps": pairs},
    ):
        m = _model(a=("GRPOLoss", {"epsilon": 0.2}))
        out = m.forward_backward(dpo_rows, advantages=[1.0, -1.0, 0.5, -0.5], **kwargs)
        results.append((out["loss"], _grads(m, "a")))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        for g, g0 in zip(grads, results[0][1]):
            assert_rel_close(g, g0)


def _embedding_rows():
    g = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(3):
        for label, length in ((1, 7), (0, 9), (0, 6)):
            ids = torch.randint(10, 4000, (length,), generator=g).tolist()
            rows.append({"input_ids": ids, "attention_mask": [1] * length, "labels": [label]})
    return rows


def test_embedding_task_trains_on_pooled_last_hidden_states():
    m = _model(a=("InfonceLoss", {"temperature": 0.07, "use_batch": True, "hard_negatives": None}))
    rows = _embedding_rows()
    out = m.forward_backward(inputs=rows, task="embedding")
    embeddings = torch.tensor(np.stack(out["embeddings"]))
    # The returned embeddings are each row's last real token's final hidden state under the
    # adapter: recompute one row alone and compare.
    unlabelled = {k: v for k, v in rows[1].items() if k != "labels"}
    single = m.forward_only([unlabelled], task="embedding")
    assert "loss" not in single
    single = single["embeddings"][0]
    np.testing.assert_allclose(embeddings[1].numpy(), single, rtol=1e-4, atol=1e-5)
    recomputed = InfonceLoss(temperature=0.07)(
        LossInputs(
            logprobs=torch.zeros(9, 1),
            mask=torch.zeros(9, 1),
            target_tokens=torch.zeros(9, 1, dtype=torch.long),
            embeddings=embeddings,
            row_labels=torch.tensor([1, 0, 0] * 3),
        )
    )
    assert out["loss"] == pytest.approx(recomputed.loss.item(), rel=1e-4)
    assert {"pos_sim", "neg_sim"} <= set(out["metrics"])
    first = out["loss"]
    for _ in range(3):
        m.clip_grad_and_step()
        out = m.forward_backward(inputs=rows, task="embedding")
    assert out["loss"] < first
    with pytest.raises(InvalidArgumentError, match="one value"):
        m.forward_backward(inputs=[{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}])


def test_gkd_with_teacher_topk_pulls_the_student_to_the_teacher(dpo_rows):
    m = _model(a=("GKDLoss", {"beta": 0.5}))
    g = np.random.default_rng(0)
    # Teacher: per input position, log-probs of 5 candidate tokens (shifted like labels).
    idx = [g.integers(0, 4000, (12, 5)).tolist() for _ in dpo_rows]
    lps = [np.log(g.dirichlet(np.ones(5), 12)).tolist() for _ in dpo_rows]
    kwargs = {"teacher_topk_logprobs": lps, "teacher_topk_indices": idx}
    losses = [m.forward_backward(dpo_rows, **kwargs)["loss"]]
    for _ in range(4):
        m.clip_grad_and_step()
        losses.append(m.forward_backward(dpo_rows, **kwargs)["loss"])
    assert losses[-1] < losses[0]
    with pytest.raises(InvalidArgumentError, match="vocabulary"):
        m.forward_backward(
            dpo_rows,
            teacher_topk_logprobs=lps,
            teacher_topk_indices=[[[10**7] * 5] * 12 for _ in dpo_rows],
        )


def test_new_preference_and_rl_losses_fuse_with_other_tenants():
    names = ("simpo", "sapo", "sft", "emb")
    losses = {
        "simpo": ("SimPOLoss", {"beta": 2.0, "gamma": 0.3}),
        "sapo": ("SAPOLoss", {"tau_pos": 2.0}),
        "emb": ("InfonceLoss", {"temperature": 0.1}),
    }
    sapo = make_batch(rows=4, seq=10, seed=7)
    requests = {
        "simpo": {"inputs": make_batch(rows=4, seq=14, seed=6)},
        "sapo": {
            "inputs": sapo,
            "advantages": [1.0, -0.5, 0.25, -1.0],
            "old_logps": (
                -8.3 + 0.05 * torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
            ),
        },
        "sft": {"inputs": make_batch(rows=2, seq=12, seed=8)},
        "emb": {"inputs": _embedding_rows(), "task": "embedding"},
    }
    fused, separate = _model(names, **losses), _model(names, **losses)
    fused_out = fused.forward_backward_many(requests)
    for name, request in requests.items():
        request = dict(request)
        out = separate.forward_backward(request.pop("inputs"), adapter_name=name, **request)
        assert fused_out[name]["loss"] == pytest.approx(out["loss"], rel=1e-5), name
        for g1, g2 in zip(_grads(fused, name), _grads(separate, name)):
            assert_rel_close(g1, g2, rel=1e-4)


def test_attached_metrics_report_through_calculate_metric(dpo_rows):
    """``add_metric('DPOMetric', beta=...)`` feeds on each training forward and reports its keys
    in ``calculate_metric``: the implicit reward margin equals the one the DPO loss computed."""
    m = _model(a=("DPOLoss", {"beta": 0.1, "reference_free": False}))
    m.add_metric("DPOMetric", beta=0.1)
    m.add_metric("LossMetric", is_training=False)
    m.forward_backward(inputs=dpo_rows)  # a first step, so that policy and reference differ
    m.clip_grad_and_step()
    m.calculate_metric(is_training=True)
    ref = m.forward_only(inputs=dpo_rows, disable_lora=True)
    out = m.forward_backward(inputs=dpo_rows, ref_outputs=ref.result)
    result = m.calculate_metric(is_training=True).result
    assert result["rewards/margins"] == pytest.approx(out["metrics"]["reward_margin"], rel=1e-5)
    assert abs(result["rewards/margins"]) > 0
    assert result["rewards/accuracies"] == pytest.approx(out["metrics"]["reward_accuracy"])
    assert 0.0 <= result["rewards/accuracies"] <= 1.0
    assert {"logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected"} <= set(result)
    # Reported and reset: a second report has nothing new.
    assert "rewards/margins" not in m.calculate_metric(is_training=True).result
    # is_training=False metrics feed on forward_only only.
    evaluated = m.forward_only(inputs=dpo_rows)
    assert m.calculate_metric(is_training=False).result["loss"] == pytest.approx(evaluated["loss"])
    with pytest.raises(InvalidArgumentError, match="Nope"):
        m.add_metric("Nope")
