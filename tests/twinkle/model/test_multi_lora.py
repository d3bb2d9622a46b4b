"""MultiLoraTransformersModel: training, isolation, accumulation, errors."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel, TransformersModel


@pytest.fixture
def model():
    m = MultiLoraTransformersModel("tiny://qwen3")
    m.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=32, target_modules="all-linear"))
    m.add_adapter_to_model(
        "b", LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "v_proj"])
    )
    m.set_optimizer("Adam", lr=1e-2, adapter_name="a")
    m.set_optimizer("AdamW", lr=1e-3, adapter_name="b")
    return m


def _snapshot(model, name):
    tenant = model.tenants[name]
    weights = {k: v.clone() for k, v in model.adapter_state_dict(name).items()}
    opt = {
        i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for i, s in tenant.optimizer.state_dict()["state"].items()
    }
    return weights, opt


def _equal_snapshots(x, y):
    wx, ox = x
    wy, oy = y
    assert wx.keys() == wy.keys()
    assert all(torch.equal(wx[k], wy[k]) for k in wx)
    assert ox.keys() == oy.keys()
    for i in ox:
        for k in ox[i]:
            a, b = ox[i][k], oy[i][k]
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_training_lowers_loss_and_leaves_other_tenant_bitwise_unchanged(model, batch):
    model.forward_backward(batch, adapter_name="b")
    model.clip_grad_and_step(adapter_name="b")  # b has optimizer state too
    before_b = _snapshot(model, "b")
    losses = []
    for _ in range(15):
        losses.append(model.forward_backward(batch, adapter_name="a")["loss"])
        model.clip_grad_and_step(adapter_name="a")
    assert losses[-1] < losses[0] - 0.5
    _equal_snapshots(before_b, _snapshot(model, "b"))
    metric = model.calculate_metric(is_training=True, adapter_name="a").result
    assert metric["step"] == 15 and metric["lr"] == pytest.approx(1e-2)
    assert metric["grad_norm"] > 0 and 0.0 <= metric["token_acc"] <= 1.0
    assert model.calculate_metric(adapter_name="b").result["step"] == 1


def test_new_adapter_is_a_no_op_and_adapters_differ_by_rank(model, batch):
    base = model.forward_only(batch, adapter_name="a")["loss"]
    assert model.forward_only(batch, adapter_name="b")["loss"] == pytest.approx(base, abs=1e-6)
    shapes = {k: tuple(v.shape) for k, v in model.adapter_state_dict("b").items()}
    assert all(32 in s for s in shapes.values())
    assert all("q_proj" in k or "v_proj" in k for k in shapes)


def test_gradient_accumulation_matches_full_batch():
    full = make_batch(rows=4)
    halves = [{k: v[:2] for k, v in full.items()}, {k: v[2:] for k, v in full.items()}]
    results = []
    for ga, batches in ((1, [full]), (2, halves)):
        m = MultiLoraTransformersModel("tiny://qwen3")
        m.add_adapter_to_model("t", LoraConfig(r=8, lora_alpha=16), gradient_accumulation_steps=ga)
        m.set_optimizer("SGD", lr=0.5)
        stepped = [
            m.forward_backward(b) and m.clip_grad_and_step(max_grad_norm=1e9) for b in batches
        ]
        assert stepped[-1] is True and all(s is False for s in stepped[:-1])
        results.append(m.adapter_state_dict())
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=1e-5, atol=1e-7)


def test_lr_scheduler_and_train_configs(model, batch):
    model.set_lr_scheduler(
        "LinearLR", adapter_name="a", start_factor=1.0, end_factor=0.5, total_iters=2
    )
    for _ in range(2):
        model.forward_backward(batch, adapter_name="a")
        model.clip_grad_and_step(adapter_name="a")
    assert model.calculate_metric(adapter_name="a").result["lr"] == pytest.approx(5e-3)
    cfg = model.get_train_configs(adapter_name="a").model_dump()
    assert cfg["lora"]["r"] == 8 and cfg["optimizer"]["name"] == "Adam"
    assert cfg["lr_scheduler"]["name"] == "LinearLR" and cfg["loss"]["name"] == "CrossEntropyLoss"


def test_cosine_and_constant_schedulers(batch):
    m = TransformersModel("tiny://qwen3")
    m.add_adapter_to_model("default", LoraConfig(r=4))
    m.set_optimizer("AdamW", lr=1.0)
    m.set_lr_scheduler("cosine", num_warmup_steps=2, num_training_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(m.calculate_metric().result["lr"])
        m.forward_backward(batch)
        m.clip_grad_and_step()
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])
    m.set_lr_scheduler("constant")
    assert m.calculate_metric().result["lr"] == pytest.approx(1.0)


def test_remove_adapter_frees_the_name(model, batch):
    model.remove_adapter("b")
    assert model.list_adapters() == ["a"]
    assert model.forward_backward(batch)["loss"] > 0  # 'a' is now the default
    model.add_adapter_to_model("b", LoraConfig(r=4))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, b: m.add_adapter_to_model("a", LoraConfig(r=4)), ValueError, "already exists"),
        (lambda m, b: m.add_adapter_to_model("c", LoraConfig(r=0)), ValueError, "positive"),
        (lambda m, b: m.add_adapter_to_model("c", {"r": -2}), ValueError, "positive"),
        (
            lambda m, b: m.add_adapter_to_model("../x", LoraConfig(r=4)),
            ValueError,
            "invalid adapter name",
        ),
        (
            lambda m, b: m.add_adapter_to_model("c", LoraConfig(r=4, target_modules=["nope"])),
            ValueError,
            "matches no",
        ),
        (lambda m, b: m.set_loss("NoSuchLoss", adapter_name="a"), ValueError, "NoSuchLoss"),
        (
            lambda m, b: m.set_optimizer("Adamax2", adapter_name="a"),
            ValueError,
            "unknown optimizer",
        ),
        (
            lambda m, b: m.set_optimizer("Adam", adapter_name="a", lr=-1.0),
            ValueError,
            "learning rate",
        ),
        (
            lambda m, b: m.set_lr_scheduler("Wiggly", adapter_name="a"),
            ValueError,
            "unknown lr scheduler",
        ),
        (lambda m, b: m.clip_grad_and_step(adapter_name="a"), RuntimeError, "forward_backward"),
        (lambda m, b: m.step(adapter_name="a"), RuntimeError, "forward_backward"),
        (lambda m, b: m.forward_backward(b, adapter_name="zz"), ValueError, "unknown adapter 'zz'"),
        (lambda m, b: m.forward_backward(b), ValueError, "pass adapter_name"),
        (
            lambda m, b: m.forward_backward(
                {**b, "input_ids": b["input_ids"] + 10**6}, adapter_name="a"
            ),
            ValueError,
            "vocabulary",
        ),
        (lambda m, b: m.forward_backward([], adapter_name="a"), ValueError, "empty"),
    ],
)
def test_clear_errors_change_nothing(model, batch, call, error, match):
    before = {n: _snapshot(model, n) for n in model.list_adapters()}
    with pytest.raises(error, match=match):
        call(model, batch)
    assert model.list_adapters() == ["a", "b"]
    for name, snap in before.items():
        _equal_snapshots(snap, _snapshot(model, name))
        assert not model.tenants[name].pending_grads


def test_transformers_model_holds_one_adapter():
    m = TransformersModel("tiny://qwen3")
    m.add_adapter_to_model("default", LoraConfig(r=4))
    with pytest.raises(ValueError, match="at most 1"):
        m.add_adapter_to_model("second", LoraConfig(r=4))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("CosineWarmupScheduler", [0.5, 1.0, 1.0, 0.5]),
        ("LinearWarmupScheduler", [0.5, 1.0, 1.0, 0.5]),
    ],
)
def test_upstream_scheduler_names(batch, name, expected):
    """ModelScope Twinkle's scheduler names, with its (num_warmup_steps, num_training_steps)."""
    m = TransformersModel("tiny://qwen3")
    m.add_adapter_to_model("default", LoraConfig(r=4))
    m.set_optimizer("AdamW", lr=1.0)
    m.set_lr_scheduler(name, num_warmup_steps=2, num_training_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(m.calculate_metric().result["lr"])
        m.forward_backward(batch)
        m.clip_grad_and_step()
    assert lrs == pytest.approx(expected)
