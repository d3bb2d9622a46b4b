"""``TwinkleClient.get_training_history`` / ``export_history`` against a live server, for a
``twinkle_client`` training loop and for a run trained through the unmodified Tinker SDK."""

import time

import pytest
from test_trackers import tensorboard_scalars

from twinkle.server.testing import KEYS, local_server, serve_in_thread
from twinkle_client import TwinkleClient
from twinkle_client.errors import NotFoundError
from twinkle_client.model import MultiLoraTransformersModel

MODEL_ID = "tiny://qwen3"
ROWS = [{"input_ids": list(range(10, 26)), "labels": list(range(10, 26))}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = local_server(tmp_path_factory.mktemp("history"), backend="mock")
    with serve_in_thread(server.app) as url:
        alice = TwinkleClient(base_url=url, api_key=KEYS["alice"], timeout=60)
        bob = TwinkleClient(base_url=url, api_key=KEYS["bob"], timeout=60)
        yield url, alice, bob
        alice.close()
        bob.close()


def wait_for(client, run_id: str, count: int):
    deadline = time.monotonic() + 20
    while len((history := client.get_training_history(run_id)).points) < count:
        assert time.monotonic() < deadline, f"{len(history.points)} points, wanted {count}"
        time.sleep(0.05)
    return history


def test_a_client_loops_history_outlives_it_and_exports_to_tensorboard(live, tmp_path):
    url, alice, bob = live
    model = MultiLoraTransformersModel(model_id=MODEL_ID, client=alice)
    model.add_adapter_to_model("curve", {"r": 4})
    model.set_optimizer("Adam", lr=0.05, adapter_name="curve")
    losses = []
    for _ in range(3):
        losses.append(model.forward_backward(ROWS, adapter_name="curve")["loss"])
        model.clip_grad_and_step(adapter_name="curve")
    run_id = model.training_run_id
    history = wait_for(alice, run_id, 3)
    assert model.get_training_history(adapter_name="curve") == history  # the local API, remote
    model.remove_adapter("curve")  # the adapter goes; its history stays with the run
    assert alice.get_training_history(run_id) == history
    assert [p.loss for p in history.points] == pytest.approx(losses)
    assert [p.step for p in alice.get_training_history(run_id, since_step=1).points] == [2, 3]
    with pytest.raises(NotFoundError):
        bob.get_training_history(run_id)
    assert alice.export_history(run_id, to="tensorboard", path=tmp_path / "tb") == 3
    logged = tensorboard_scalars(tmp_path / "tb")["loss"]
    assert logged == [(s, pytest.approx(v, rel=1e-6)) for s, v in zip([1, 2, 3], losses)]


def test_tinker_forward_backward_and_optim_step_are_recorded(live):
    url, alice, _ = live
    from twinkle_client import init_tinker_client

    init_tinker_client()
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=KEYS["alice"])
    training = service.create_lora_training_client(base_model="tiny/qwen3", rank=4).result(60)
    tokens = list(range(10, 30))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    metrics = []
    for lr in (1e-2, 5e-3):
        fwd = training.forward_backward([datum], "cross_entropy").result(60)
        opt = training.optim_step(types.AdamParams(learning_rate=lr)).result(60)
        metrics.append((fwd.metrics["loss:sum"], opt.metrics["grad_norm:mean"]))
    history = wait_for(alice, training.model_id, 2)
    assert [p.step for p in history.points] == [1, 2]
    assert [p.learning_rate for p in history.points] == pytest.approx([1e-2, 5e-3])
    assert [p.grad_norm for p in history.points] == pytest.approx([g for _, g in metrics])
    assert [p.loss for p in history.points] == pytest.approx([loss for loss, _ in metrics])
    assert history.points[0].num_tokens == history.points[1].num_tokens > 0
    if hasattr(service, "close"):
        service.close("success").result(timeout=30)
