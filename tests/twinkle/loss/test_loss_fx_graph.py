"""Server-side custom loss graphs: the allow-list, the limits, gradients equal to the built-in
loss, and per-tenant isolation in a fused pass."""

import pytest
import torch
from peft import LoraConfig
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import InvalidArgumentError
from twinkle.loss import LossInputs, TinkerCrossEntropyLoss, fx_graph
from twinkle.loss.fx_graph import CustomGraphLoss, parse_graph


def spec(fn, ranks):
    handle = trace_loss(fn, ranks, "session")
    return encode_graph(handle).model_dump(), [i.model_dump() for i in handle.inputs]


def ce(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/ce:sum": loss}


def outer(logprobs):
    return (logprobs.reshape(-1, 1) * logprobs.reshape(1, -1)).sum(), {}


def node(target, args, kind="call_function", kwargs=None):
    return {
        "nodes": [
            {"op": "placeholder", "name": "logprobs", "target": "logprobs"},
            {"op": kind, "name": "x", "target": target, "args": args, "kwargs": kwargs or {}},
            {"op": "output", "name": "output", "target": "output",
             "args": [{"tuple": [{"ref": "x"}, {"dict": {}}]}]},
        ]
    }  # fmt: skip


LP = [{"name": "logprobs", "rank": 1}]


def test_custom_cross_entropy_equals_the_builtin_with_gradients():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 6, generator=g)
    mask = torch.ones(3, 6)
    mask[2, 4:] = 0  # a shorter datum
    weights = torch.rand(3, 6, generator=g) * mask
    graph, inputs = spec(ce, {"logprobs": 1, "weights": 1})
    values = [[{"data": weights[i][mask[i].bool()].tolist(), "shape": []}] for i in range(3)]
    custom = CustomGraphLoss(graph=graph, inputs=inputs, values=values)
    a, b = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    out = custom(LossInputs(logprobs=a, mask=mask, target_tokens=mask.long()))
    ref = TinkerCrossEntropyLoss()(
        LossInputs(logprobs=b, mask=mask, target_tokens=mask.long(), weights=weights)
    )
    out.loss.backward()
    ref.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-6)
    assert out.metrics["custom/ce:sum"] == pytest.approx(float(ref.loss.detach()), rel=1e-6)


@pytest.mark.parametrize(
    ("graph", "named"),
    [
        (node("builtins.exec", ["x"]), "builtins.exec"),
        (node("torch.softmax", [{"ref": "logprobs"}, -1]), "torch.softmax"),
        (node("torch.exp", [{"ref": "logprobs"}], kwargs={"out": {"ref": "logprobs"}}), "out"),
        (node("getattr", [{"ref": "logprobs"}, "__class__"]), "__class__"),
        (node("to", [{"ref": "logprobs"}, {"device": "cuda"}], kind="call_method"), "device"),
        (node("mul_", [{"ref": "logprobs"}, 2], kind="call_method"), "mul_"),
        (node("w", [], kind="get_attr"), "get_attr"),
        (node("torch.exp", [{"ref": "later"}]), "later"),
    ],
)
def test_anything_off_the_allow_list_is_refused_by_name(graph, named):
    with pytest.raises(InvalidArgumentError, match=named):
        parse_graph(graph, LP)


def test_node_limit():
    graph = node("torch.exp", [{"ref": "logprobs"}])
    graph["nodes"][1:1] = [
        {
            "op": "call_function",
            "name": f"n{i}",
            "target": "torch.exp",
            "args": [{"ref": "logprobs"}],
        }
        for i in range(fx_graph.MAX_NODES)
    ]
    with pytest.raises(InvalidArgumentError, match="over the limit"):
        parse_graph(graph, LP)


def test_a_tensor_over_the_size_limit_is_refused_before_it_is_made(monkeypatch):
    monkeypatch.setattr(fx_graph, "MAX_ELEMENTS", 10_000)
    loss = parse_graph(*spec(outer, {"logprobs": 1}))
    assert loss.run([torch.randn(100)], deadline=float("inf"))[0].ndim == 0
    with pytest.raises(InvalidArgumentError, match=r"shape \(101, 101\)"):
        loss.run([torch.randn(101)], deadline=float("inf"))


def test_time_limit():
    loss = parse_graph(*spec(outer, {"logprobs": 1}))
    with pytest.raises(InvalidArgumentError, match="time limit"):
        loss.run([torch.randn(4)], deadline=0.0)


def not_scalar(logprobs):
    return logprobs * 2, {}


def test_a_failing_custom_loss_in_a_fused_pass_changes_no_gradient():
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("tiny://qwen3", seed=0)
    for name in ("a", "b"):
        model.add_adapter_to_model(name, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    batch = make_batch(rows=2, seq=12)
    graph, inputs = spec(not_scalar, {"logprobs": 1})
    bad = {"name": "custom", "graph": graph, "inputs": inputs, "values": [[], []]}
    with pytest.raises(InvalidArgumentError, match="scalar"):
        model.forward_backward_many(
            {"a": {"inputs": batch, "loss": bad}, "b": {"inputs": batch, "loss": "cross_entropy"}}
        )
    for name in ("a", "b"):
        assert all(p.grad is None or not p.grad.any() for p in model.tenants[name].params)
    assert model.forward_backward(batch, adapter_name="b", loss="cross_entropy")["loss"] > 0
