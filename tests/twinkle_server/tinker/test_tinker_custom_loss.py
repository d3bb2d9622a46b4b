"""Custom losses with the unmodified SDK: server-side graphs (``create_custom_loss``) and the
client-side ``forward_backward_custom`` path, against a live Twinkle server."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import tinker
import torch
from sdk_version import needs_in_process_server, requires_sdk
from tinker import types

from tests.twinkle_server.tinker.test_tinker_sdk import BASE_MODEL, DATA, SEQ, sft_datum
from twinkle.server.testing import KEYS

pytestmark = pytest.mark.integration


def ce_graph(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/ce:sum": loss, "custom/w:mean": weights.mean()}


def ce_callable(data, logprobs_list):
    loss = sum(
        -(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs_list)
    )
    return loss, {}


def uses_softmax(logprobs):
    loss = torch.softmax(logprobs, dim=-1).sum()
    return loss, {}


def too_many_nodes(logprobs):
    loss = logprobs.sum()
    for _ in range(600):
        loss = loss + 1.0
    return loss, {}


def not_scalar(logprobs, weights):
    return -(logprobs * weights), {}


@pytest.fixture(scope="module")
def carol(service):
    return service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)


def grads_of(live_server, client) -> list[torch.Tensor]:
    model = live_server[1].services["model"]
    owner = live_server[1].context.authenticate({"x-api-key": KEYS["alice"]})
    tenant = model.model.tenants[model._internal(owner, client.model_id)]
    return [p.grad.detach().clone() for p in tenant.params if p.grad is not None]


def grads_after(live_server, client, submit) -> tuple[types.ForwardBackwardOutput, list]:
    """Run ``submit()`` (a forward_backward), read the gradients, drop them (lr 0 moves nothing)."""
    out = submit().result(timeout=60)
    grads = grads_of(live_server, client)
    client.optim_step(types.AdamParams(learning_rate=0.0)).result(timeout=60)
    return out, grads


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


@needs_in_process_server
@requires_sdk("0.38", "create_custom_loss")
def test_server_side_cross_entropy_matches_the_builtin(service, carol, live_server):
    handle = service.create_custom_loss(ce_graph, {"logprobs": 1, "weights": 1}).result(timeout=60)
    assert handle.loss_id is not None  # uploaded: the server runs it
    builtin, g_builtin = grads_after(
        live_server, carol, lambda: carol.forward_backward(DATA, "cross_entropy")
    )
    custom, g_custom = grads_after(
        live_server, carol, lambda: carol.forward_backward_custom(DATA, handle)
    )
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-6)
    assert custom.metrics["custom/ce:sum"] == pytest.approx(custom.metrics["loss:sum"], rel=1e-6)
    weights = [d.loss_fn_inputs["weights"].to_numpy().mean() for d in DATA]
    assert custom.metrics["custom/w:mean"] == pytest.approx(sum(weights) / 2, rel=1e-6)
    assert_same(g_builtin, g_custom)


@needs_in_process_server
def test_client_side_forward_backward_custom_still_works(carol, live_server):
    builtin, g_builtin = grads_after(
        live_server, carol, lambda: carol.forward_backward(DATA, "cross_entropy")
    )
    custom, g_custom = grads_after(
        live_server, carol, lambda: carol.forward_backward_custom(DATA, ce_callable)
    )
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-5)
    assert_same(g_builtin, g_custom)


@requires_sdk("0.38", "create_custom_loss")
def test_an_op_off_the_allow_list_is_a_400_naming_it(service):
    with pytest.raises(tinker.BadRequestError, match="torch.softmax"):
        service.create_custom_loss(uses_softmax, {"logprobs": 1}).result(timeout=60)


@requires_sdk("0.38", "create_custom_loss")
def test_a_graph_over_the_node_limit_is_refused(service):
    with pytest.raises(tinker.BadRequestError, match="over the limit of 512"):
        service.create_custom_loss(too_many_nodes, {"logprobs": 1}).result(timeout=60)


@pytest.mark.parametrize(
    ("node", "named"),
    [
        ({"op": "call_function", "target": "builtins.eval", "args": ["1"]}, "builtins.eval"),
        ({"op": "call_function", "target": "os.system", "args": ["true"]}, "os.system"),
        ({"op": "call_module", "target": "evil", "args": []}, "call_module"),
        ({"op": "get_attr", "target": "weight", "args": []}, "get_attr"),
        ({"op": "call_method", "target": "add_", "args": [{"ref": "logprobs"}, 1]}, "add_"),
        ({"op": "call_method", "target": "numpy", "args": [{"ref": "logprobs"}]}, "numpy"),
    ],
)
def test_a_python_call_node_sent_raw_is_a_400_naming_it(live_server, node, named):
    with httpx.Client(
        base_url=live_server[0], headers={"X-API-Key": KEYS["alice"]}, timeout=30
    ) as http:
        session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        graph = {
            "nodes": [
                {"op": "placeholder", "name": "logprobs", "target": "logprobs"},
                {"name": "bad", "kwargs": {}, **node},
                {"op": "output", "name": "output", "target": "output", "args": [
                    {"tuple": [{"ref": "bad"}, {"dict": {}}]}
                ]},
            ]
        }  # fmt: skip
        reply = http.post(
            "/api/v1/create_custom_loss",
            json={
                "session_id": session,
                "custom_loss_seq_id": 0,
                "name": "bad",
                "inputs": [{"name": "logprobs", "rank": 1}],
                "graph": graph,
            },
        )
    assert reply.status_code == 400
    assert named in reply.text


@requires_sdk("0.38", "create_custom_loss")
def test_a_failing_custom_loss_fails_only_its_own_request(service, service_bob, carol):
    bob = service_bob.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)
    handle = service.create_custom_loss(not_scalar, {"logprobs": 1, "weights": 1}).result(
        timeout=60
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(lambda: carol.forward_backward_custom(DATA, handle).result(timeout=60))
        good = pool.submit(lambda: bob.forward_backward(DATA, "cross_entropy").result(timeout=60))
        assert good.result().metrics["loss:sum"] > 0
        with pytest.raises(tinker.RequestFailedError, match="scalar") as failed:
            bad.result()
    assert failed.value.category.name == "User"
    carol.forward_backward([sft_datum(SEQ)], "cross_entropy").result(timeout=60)
    carol.optim_step(types.AdamParams(learning_rate=0.0)).result(timeout=60)
