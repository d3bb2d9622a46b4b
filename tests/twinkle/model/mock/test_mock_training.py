"""MockModel training behaviour: learning, determinism, isolation, accumulation, gradients."""

import numpy as np
import pytest

from twinkle.model.mock import MockModel

pytestmark = pytest.mark.unit

BATCH = [
    {"input_ids": [1, 5, 9, 13, 17, 21], "labels": [-100, -100, 9, 13, 17, 21]},
    {"input_ids": [2, 4, 6, 8], "labels": [-100, 4, 6, 8]},
]


def _model(accum=1, lr=1e-2, names=("a",), rank=4):
    model = MockModel(vocab_size=32, hidden_size=8, seed=0)
    for name in names:
        model.add_adapter_to_model(
            name, {"r": rank, "lora_alpha": 8}, gradient_accumulation_steps=accum
        )
        model.set_loss("CrossEntropyLoss", adapter_name=name)
        model.set_optimizer("Adam", adapter_name=name, lr=lr)
    return model


def _losses(model, steps, adapter_name=None):
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(BATCH, adapter_name=adapter_name)["loss"])
        model.clip_grad_and_step(adapter_name=adapter_name)
    return losses


def test_loss_decreases_on_a_repeated_batch():
    losses = _losses(_model(), 30)
    assert losses[-1] < 0.8 * losses[0]
    assert all(b < a for a, b in zip(losses[1:], losses[2:]))


def test_cross_entropy_and_logprobs_match_a_numpy_reference():
    model = _model()
    out = model.forward_only(BATCH)
    # With B = 0 the adapter is the identity, so logits are E[x] @ W.
    logits = model.base.embed_V_H @ model.base.unembed_H_V
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected_rows, total, count = [], 0.0, 0
    for row in BATCH:
        ids, labels = row["input_ids"], row["labels"]
        lp = [0.0] + [
            logp[ids[t - 1], labels[t]] if labels[t] != -100 else 0.0 for t in range(1, len(ids))
        ]
        expected_rows.append(lp)
        total += -sum(lp)
        count += sum(label != -100 for label in labels[1:])
    assert out["loss"] == pytest.approx(total / count)
    model.set_loss("cross_entropy")
    assert model.forward_only(BATCH)["loss"] == pytest.approx(total)
    for got, want in zip(out["logprobs"], expected_rows):
        np.testing.assert_allclose(got, want)


def test_two_runs_are_bitwise_equal():
    first, second = _model(), _model()
    assert _losses(first, 10) == _losses(second, 10)
    for key in ("A", "B"):
        assert np.array_equal(first._adapters["a"].params[key], second._adapters["a"].params[key])


def test_training_one_tenant_leaves_the_other_bitwise_untouched():
    model = _model(names=("a", "b"))
    before = {k: v.copy() for k, v in model._adapters["b"].params.items()}
    _losses(model, 5, adapter_name="a")
    after = model._adapters["b"]
    assert all(np.array_equal(before[k], after.params[k]) for k in before)
    assert all(not g.any() for g in after.grads.values())
    assert after.cur_step == 0 and after.optimizer.state == {}
    assert not np.array_equal(model._adapters["a"].params["B"], before["B"])


def test_tenant_results_do_not_depend_on_other_tenants():
    alone = _model(names=("a",))
    shared = _model(names=("b", "a"))
    _losses(shared, 3, adapter_name="b")
    assert _losses(alone, 5, adapter_name="a") == _losses(shared, 5, adapter_name="a")


def test_gradient_accumulation_averages_micro_batches():
    accum = _model(accum=2, lr=0.1)
    full = _model(accum=1, lr=0.1)
    accum.set_optimizer("SGD", lr=0.1)
    full.set_optimizer("SGD", lr=0.1)
    first, second = BATCH[:1], BATCH[1:]
    accum.forward_backward(first)
    accum.clip_grad_and_step(max_grad_norm=None)
    assert accum._adapters["a"].cur_step == 0
    accum.forward_backward(second)
    accum.clip_grad_and_step(max_grad_norm=None)
    assert accum._adapters["a"].cur_step == 1
    # Reference: the mean of the two micro-batch gradients, applied once.
    full.forward_backward(first)
    full.forward_backward(second)
    full._adapters["a"].grads = {k: g / 2 for k, g in full._adapters["a"].grads.items()}
    full.clip_grad_and_step(max_grad_norm=None)
    for key in ("A", "B"):
        np.testing.assert_allclose(
            accum._adapters["a"].params[key], full._adapters["a"].params[key]
        )


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "importance_sampling"])
def test_analytic_gradients_match_finite_differences(loss):
    model = _model(rank=3)
    state = model._adapters["a"]
    rng = np.random.default_rng(1)
    state.params["B"] = rng.standard_normal(state.params["B"].shape) * 0.3
    model.set_loss(loss)
    batch = [
        dict(row, old_logprobs=rng.standard_normal(len(row["input_ids"])) * 0.1 - 3)
        for row in BATCH
    ]
    kwargs = {"advantages": [1.5, -0.7]} if loss == "importance_sampling" else {}
    model.forward_backward(batch, **kwargs)
    eps = 1e-6
    for key in ("A", "B"):
        param = state.params[key]
        for index in [(0, 0), (1, 2), (param.shape[0] - 1, param.shape[1] - 1)]:
            orig = param[index]
            param[index] = orig + eps
            up = model.forward_only(batch, **kwargs)["loss"]
            param[index] = orig - eps
            down = model.forward_only(batch, **kwargs)["loss"]
            param[index] = orig
            assert state.grads[key][index] == pytest.approx(
                (up - down) / (2 * eps), rel=1e-5, abs=1e-8
            )


def test_importance_sampling_is_summed_and_on_policy_by_default():
    model = _model()
    model.set_loss("importance_sampling")
    out = model.forward_only(BATCH, advantages=[2.0, -1.0])
    # Without old_logprobs r = 1: loss = -(4 tokens * 2 + 3 tokens * -1)
    assert out["loss"] == pytest.approx(-5.0)
    with pytest.raises(ValueError, match="advantages"):
        model.forward_only(BATCH)


def test_metrics_and_train_configs():
    model = _model()
    model.set_lr_scheduler("LinearLR", total_iters=4)
    model.set_template("Qwen3_5Template")
    model.set_processor("InputProcessor", padding_side="right")
    _losses(model, 2)
    result = model.calculate_metric(is_training=True).result
    assert set(result) == {"loss", "token_acc", "grad_norm", "lr", "step"}
    assert result["step"] == 2 and result["grad_norm"] > 0 and 0 <= result["token_acc"] <= 1
    # torch LinearLR: 1/3 -> 1 over 4 steps; after 2 steps the factor is 1/3 + (2/3) * 2/4.
    assert result["lr"] == pytest.approx(1e-2 * (1 / 3 + 1 / 3))
    dump = model.get_train_configs().model_dump()
    assert dump["template"] == "Qwen3_5Template" and dump["processor"] == {"name": "InputProcessor"}
    assert dump["lora"]["r"] == 4 and dump["optimizer"]["name"] == "Adam"
    assert dump["lr_scheduler"] == {"name": "LinearLR", "total_iters": 4}
    # The same type as the torch backends' and the client's, so scripts run against either.
    from twinkle_client.types import TrainConfigs

    assert isinstance(model.get_train_configs(), TrainConfigs)


def test_lr_schedules():
    model = _model()
    model.set_lr_scheduler("cosine", T_max=10)
    state = model._adapters["a"]
    state.cur_step = 5
    assert state.current_lr() == pytest.approx(0.5e-2)
    model.set_lr_scheduler("default", lr_decay_steps=10, max_lr=1e-3)
    state.cur_step = 10
    assert state.current_lr() == pytest.approx(0.0)
    model.set_lr_scheduler("constant")
    assert state.current_lr() == pytest.approx(1e-2)


def test_a_trajectory_is_refused_naming_the_mock_backend():
    model = _model()
    trajectory = {"messages": [{"role": "user", "content": "1+1="}]}
    with pytest.raises(ValueError, match="mock backend trains on encoded rows only"):
        model.forward_backward([trajectory])
