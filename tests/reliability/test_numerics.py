"""Stale gradients after a load, and finite weights (issue 47, items 3 and 4).

- A load (native ``load``, Tinker ``load_weights``) drops the gradients pending from before and
  restarts the accumulation window: the next step moves the loaded weights by new gradients only.
- Hyper-parameters outside their range are refused up front with the range; a step that would
  make a weight non-finite is not applied (weights, optimizer state and gradients as before) and
  answers a 4xx naming the cause; non-finite results are encoded ("NaN"), never a 500; a tenant's
  NaN adapter does not touch its neighbours in the same fused pass.

Library tests run the transformers backend and the mock; server tests run in-process.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import orjson
import pytest
import torch

from twinkle.errors import InvalidArgumentError, NonFiniteUpdateError, StateOrderError  # noqa: E402
from twinkle.model import AdamParams, MockModel, MultiLoraTransformersModel  # noqa: E402
from twinkle.server.testing import client, local_server  # noqa: E402
from twinkle.server.web.encoding import finite_json, jsonable  # noqa: E402

ROWS = [
    {"input_ids": [11, 12, 13, 14, 15, 16], "labels": [-100, -100, -100, 14, 15, 16]},
    {"input_ids": [11, 12, 13, 24, 25], "labels": [-100, -100, -100, 24, 25]},
]
OTHER = [{"input_ids": [31, 32, 33, 34], "labels": [-100, 32, 33, 34]}]
MODEL = "/api/v1/model/tiny/qwen3"


def _torch_model(accum: int = 1, names=("a",)) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel("tiny://qwen3", seed=0)
    for name in names:
        model.add_adapter_to_model(name, {"r": 4, "lora_alpha": 8}, accum)
        model.set_optimizer("Adam", lr=1e-2, adapter_name=name)
    return model


def _mock_model(accum: int = 1, names=("a",)) -> MockModel:
    model = MockModel("mock://tiny")
    for name in names:
        model.add_adapter_to_model(name, {"r": 4, "lora_alpha": 8}, accum)
        model.set_optimizer("Adam", lr=1e-2, adapter_name=name)
    return model


BACKENDS = {"transformers": _torch_model, "mock": _mock_model}


def _weights(model, name="a") -> dict[str, np.ndarray]:
    if isinstance(model, MockModel):
        return {k: v.copy() for k, v in model._resolve(name).params.items()}
    return {k: v.detach().clone().numpy() for k, v in model.adapter_state_dict(name).items()}


def _optimizer_state(model, name="a") -> dict:
    if isinstance(model, MockModel):
        opt = model._resolve(name).optimizer
        return {"steps": opt.steps, **{k: v.copy() for k, v in opt.state.items()}}
    state = model.tenants[name].optimizer.state_dict()["state"]
    return {
        f"{i}.{k}": v.clone().numpy() if torch.is_tensor(v) else v
        for i, entry in state.items()
        for k, v in entry.items()
    }


def _grads(model, name="a") -> list[np.ndarray]:
    if isinstance(model, MockModel):
        return [g.copy() for g in model._resolve(name).grads.values()]
    return [p.grad.clone().numpy() for p in model.tenants[name].params if p.grad is not None]


def _same(x, y) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    if isinstance(x, np.ndarray):
        return np.array_equal(x, y, equal_nan=True)
    return x == y


def _state(model, name="a"):
    return _weights(model, name), _optimizer_state(model, name), _grads(model, name)


def _poison_grads(model, name="a") -> None:
    if isinstance(model, MockModel):
        model._resolve(name).grads["A"][0, 0] = np.nan
    else:
        next(p for p in model.tenants[name].params if p.grad is not None).grad.view(-1)[0] = np.nan


def _set_weights(model, value: float, name="a") -> None:
    if isinstance(model, MockModel):
        for array in model._resolve(name).params.values():
            array.fill(value)
    else:
        with torch.no_grad():
            for param in model.tenants[name].params:
                param.fill_(value)


# ------------------------------------------------------------------ item 3: load drops gradients
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_step_after_load_uses_only_new_gradients(backend, tmp_path):
    model = BACKENDS[backend]()
    model.forward_backward(ROWS, adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    checkpoint = model.save("ck", output_dir=tmp_path, adapter_name="a")
    loaded = _weights(model)
    model.forward_backward(OTHER, adapter_name="a")  # stale: computed on the weights before load
    model.load(checkpoint, adapter_name="a")
    assert _same(_weights(model), loaded)
    if backend == "transformers":  # the mock's step refuses to step without gradients itself
        with pytest.raises(StateOrderError, match="no gradients"):
            model.clip_grad_and_step(adapter_name="a")
    with pytest.raises(StateOrderError, match="without gradients"):
        model.optim_step(AdamParams(learning_rate=1e-2), adapter_name="a")
    model.forward_backward(ROWS, adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")

    twin = BACKENDS[backend]()  # the same history without the stale forward_backward
    twin.forward_backward(ROWS, adapter_name="a")
    twin.clip_grad_and_step(adapter_name="a")
    twin.load(checkpoint, adapter_name="a")
    twin.forward_backward(ROWS, adapter_name="a")
    twin.clip_grad_and_step(adapter_name="a")
    for key, value in _weights(twin).items():
        np.testing.assert_allclose(_weights(model)[key], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_load_restarts_the_accumulation_window(backend, tmp_path):
    model = BACKENDS[backend](accum=2)
    checkpoint = model.save("ck", output_dir=tmp_path, adapter_name="a")
    model.forward_backward(ROWS, adapter_name="a")
    assert model.clip_grad_and_step(adapter_name="a") is False  # 1 of 2
    model.load(checkpoint, adapter_name="a")
    model.forward_backward(ROWS, adapter_name="a")
    # Before the fix this stepped (2 of 2), on the stale half of the window plus the new one.
    assert model.clip_grad_and_step(adapter_name="a") is False
    model.forward_backward(ROWS, adapter_name="a")
    assert model.clip_grad_and_step(adapter_name="a") is True


def test_resume_keeps_the_checkpoints_own_pending_gradients(tmp_path):
    model = _torch_model(accum=2)
    model.forward_backward(ROWS, adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")  # 1 of 2: gradients pending, saved with them
    checkpoint = model.save("mid", output_dir=tmp_path, save_optimizer=True, adapter_name="a")
    model.forward_backward(OTHER, adapter_name="a")
    model.resume_from_checkpoint(checkpoint, adapter_name="a")
    tenant = model.tenants["a"]
    assert tenant.pending_grads and tenant.micro_step == 1
    model.forward_backward(ROWS, adapter_name="a")
    assert model.clip_grad_and_step(adapter_name="a") is True


# ----------------------------------------------------------- item 4: hyper-parameters up front
BAD_OPTIMIZER_KWARGS = [
    ({"lr": 1e30}, "lr (the learning rate) must be a finite number in (0, 10]"),
    ({"lr": 0.0}, "lr (the learning rate) must be a finite number in (0, 10]"),
    ({"lr": float("nan")}, "lr (the learning rate) must be a finite number"),
    ({"betas": (1.5, 0.9)}, "beta1 must be a finite number in [0, 1)"),
    ({"betas": (0.9, 1.0)}, "beta2 must be a finite number in [0, 1)"),
    ({"eps": 0.0}, "eps must be a finite number in (0, 1]"),
    ({"weight_decay": -1.0}, "weight_decay must be a finite number in [0, 1]"),
    ({"weight_decay": 1e9}, "weight_decay must be a finite number in [0, 1]"),
]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("kwargs,message", BAD_OPTIMIZER_KWARGS)
def test_set_optimizer_refuses_values_outside_their_range(backend, kwargs, message):
    model = BACKENDS[backend]()
    before = model.get_train_configs(adapter_name="a").optimizer
    with pytest.raises(InvalidArgumentError) as info:
        model.set_optimizer("AdamW", adapter_name="a", **{"lr": 1e-3, **kwargs})
    assert message in str(info.value)
    assert model.get_train_configs(adapter_name="a").optimizer == before


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "field,value,message",
    [
        ("learning_rate", 1e30, "learning_rate must be a finite number in [0, 10]"),
        ("eps", 0.0, "eps must be a finite number in (0, 1]"),
        ("weight_decay", 2.0, "weight_decay must be a finite number in [0, 1]"),
    ],
)
def test_optim_step_refuses_values_outside_their_range(backend, field, value, message):
    model = BACKENDS[backend]()
    model.forward_backward(ROWS, adapter_name="a")
    before = _state(model)
    with pytest.raises(InvalidArgumentError, match=re_escape(message)):
        model.optim_step(AdamParams(**{field: value}), adapter_name="a")
    assert _same(_state(model), before)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("norm", [0.0, -1.0, float("nan")])
def test_clip_grad_and_step_refuses_a_bad_max_grad_norm(backend, norm):
    model = BACKENDS[backend]()
    model.forward_backward(ROWS, adapter_name="a")
    with pytest.raises(InvalidArgumentError, match="max_grad_norm must be a finite number"):
        model.clip_grad_and_step(max_grad_norm=norm, adapter_name="a")


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


# ---------------------------------------------------------------- item 4: the step guard
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("how", ["clip_grad_and_step", "optim_step"])
def test_non_finite_gradients_are_not_applied(backend, how):
    model = BACKENDS[backend]()
    model.forward_backward(ROWS, adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")  # optimizer state exists
    model.forward_backward(ROWS, adapter_name="a")
    _poison_grads(model)
    before = _state(model)
    with pytest.raises(NonFiniteUpdateError, match="'a'.*gradients are not finite") as info:
        if how == "optim_step":
            model.optim_step(AdamParams(learning_rate=1e-3), adapter_name="a")
        else:
            model.clip_grad_and_step(adapter_name="a")
    assert "unchanged" in str(info.value)
    assert _same(_state(model), before)  # weights, optimizer state, gradients: bitwise
    assert model.calculate_metric(adapter_name="a").result["step"] == 1
    # Learning rate 0 reports the norm and drops the gradients: training goes on.
    out = model.optim_step(AdamParams(learning_rate=0.0), adapter_name="a")
    assert math.isnan(out["grad_norm"]) and _same(_weights(model), before[0])
    model.forward_backward(ROWS, adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    assert all(np.isfinite(v).all() for v in _weights(model).values())


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_an_update_that_overflows_is_rolled_back(backend):
    """Finite gradients, finite weights, hyper-parameters in range: AdamW's decoupled decay
    multiplies huge weights by 1 - 10 * 1 = -9, past the float range. Checked after the step,
    rolled back bitwise, the previous optimizer kept."""
    model = BACKENDS[backend]()
    model.forward_backward(ROWS, adapter_name="a")
    _set_weights(model, 1e308 if backend == "mock" else 1e38)  # float64 / float32
    before = _state(model)
    config = model.get_train_configs(adapter_name="a").optimizer
    with pytest.raises(NonFiniteUpdateError, match="'a'.*would make its weights non-finite"):
        model.optim_step(AdamParams(learning_rate=10.0, weight_decay=1.0), adapter_name="a")
    assert _same(_state(model), before)
    assert model.get_train_configs(adapter_name="a").optimizer == config  # still Adam
    model.set_optimizer("AdamW", lr=10.0, weight_decay=1.0, adapter_name="a")
    with pytest.raises(NonFiniteUpdateError, match="lr 10, weight_decay 1"):
        model.clip_grad_and_step(adapter_name="a")
    assert _same(_state(model)[0], before[0]) and _same(_state(model)[2], before[2])


def test_a_batched_step_is_all_or_nothing():
    """The server reruns a failed batched step tenant by tenant: nobody may have stepped."""
    model = _torch_model(names=("a", "b"))
    for name in ("a", "b"):
        model.forward_backward(ROWS, adapter_name=name)
    _poison_grads(model, "b")
    before = {name: _state(model, name) for name in ("a", "b")}
    with pytest.raises(NonFiniteUpdateError, match="'b'"):
        model.clip_grad_and_step_many(["a", "b"])
    for name in ("a", "b"):
        assert _same(_state(model, name), before[name])
        assert model.tenants[name].micro_step == 0 and model.tenants[name].cur_step == 0
    assert model.clip_grad_and_step(adapter_name="a") is True
    with pytest.raises(NonFiniteUpdateError):
        model.clip_grad_and_step(adapter_name="b")


def test_plain_step_is_guarded_too():
    model = _torch_model()
    model.forward_backward(ROWS, adapter_name="a")
    _poison_grads(model)
    before = _state(model)
    with pytest.raises(NonFiniteUpdateError):
        model.step(adapter_name="a")
    assert _same(_state(model), before)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_load_refuses_non_finite_weights(backend, tmp_path):
    model = BACKENDS[backend]()
    good = _weights(model)
    _set_weights(model, float("nan"))
    checkpoint = model.save("nan", output_dir=tmp_path, adapter_name="a")
    _set_weights(model, 0.5)
    with pytest.raises(InvalidArgumentError, match="non-finite adapter weights"):
        model.load(checkpoint, adapter_name="a")
    assert all((v == 0.5).all() for v in _weights(model).values()) and good


def test_a_nan_adapter_leaves_its_neighbours_in_a_fused_pass_untouched():
    """A fused pass with a non-finite loss is refused before its backward, naming the cause;
    nothing was applied, so the server's rerun tenant by tenant gives the neighbour its solo
    result."""
    model = _torch_model(names=("a", "b"))
    alone = model.forward_backward(ROWS, adapter_name="a")
    grads_alone = _grads(model, "a")
    model.zero_grad(adapter_name="a")
    weights_a = _weights(model, "a")
    _set_weights(model, float("nan"), name="b")
    with pytest.raises(InvalidArgumentError) as info:
        model.forward_backward_many({"a": {"inputs": ROWS}, "b": {"inputs": ROWS}})
    assert "'b' (nan: its adapter weights are not finite" in str(info.value)
    assert "'a'" not in str(info.value) and "loss inputs" not in str(info.value)
    assert not model.tenants["a"].pending_grads and _same(_weights(model, "a"), weights_a)
    again = model.forward_backward(ROWS, adapter_name="a")
    assert again["loss"] == alone["loss"]
    for got, want in zip(_grads(model, "a"), grads_alone):
        np.testing.assert_array_equal(got, want)
    out = model.forward_only(ROWS, adapter_name="b")
    assert finite_json(jsonable(out))["loss"] == "NaN"


# ------------------------------------------------------------------------- encoding
def test_non_finite_floats_are_encoded_as_strings():
    value = {
        "loss": float("nan"),
        "logprobs": [[0.5, float("-inf")], np.array([1.0, np.inf], dtype=np.float32)],
        "n": 3,
        "ok": [1.0, 2.0],
    }
    assert jsonable(value) == {
        "loss": "NaN",
        "logprobs": [[0.5, "-Infinity"], [1.0, "Infinity"]],
        "n": 3,
        "ok": [1.0, 2.0],
    }
    assert orjson.loads(orjson.dumps(jsonable(value)))  # strict JSON


def test_the_tinker_sdk_reads_the_encoding_back_as_floats():
    from tinker import types

    body = orjson.dumps({"metrics": finite_json({"grad_norm:mean": float("nan"), "x": -math.inf})})
    metrics = types.OptimStepResponse.model_validate(orjson.loads(body)).metrics
    assert math.isnan(metrics["grad_norm:mean"]) and metrics["x"] == -math.inf


# ------------------------------------------------------------------------- served
def _service_model(server):
    return server.services["model"].model


def _internal(server) -> str:
    (name,) = _service_model(server).tenants
    return name


def _served(tmp_path, scenario):
    server = local_server(tmp_path)

    async def run():
        async with client(server, "alice") as alice:
            r = await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )
            assert r.status_code == 200, r.text
            return await scenario(server, alice)

    return asyncio.run(run())


async def _post(http, op: str, **body):
    return await http.post(f"{MODEL}/{op}", json={"adapter_name": "a", **body})


def test_served_hyper_parameters_out_of_range_are_400s(tmp_path):
    async def scenario(server, alice):
        bad_lr = await _post(alice, "set_optimizer", optimizer="AdamW", lr=1e30)
        bad_betas = await _post(alice, "set_optimizer", optimizer="Adam", betas=[0.9, 2.0])
        await _post(alice, "forward_backward", inputs=ROWS)
        bad_adam = await _post(alice, "optim_step", adam_params={"learning_rate": 1e30})
        return bad_lr, bad_betas, bad_adam

    for reply, text in zip(
        _served(tmp_path, scenario),
        [
            "lr (the learning rate) must be a finite number in (0, 10]",
            "beta2",
            "learning_rate must be a finite",
        ],
    ):
        assert reply.status_code == 400 and text in reply.json()["error"], reply.text


def test_served_load_drops_pending_gradients(tmp_path):
    async def scenario(server, alice):
        saved = await _post(alice, "save", name="ck")
        assert saved.status_code == 200, saved.text
        assert (await _post(alice, "forward_backward", inputs=ROWS)).status_code == 200
        loaded = await _post(alice, "load", path=saved.json()["result"]["path"])
        assert loaded.status_code == 200, loaded.text
        return await _post(alice, "clip_grad_and_step")

    step = _served(tmp_path, scenario)
    assert step.status_code == 400 and "no gradients" in step.json()["error"], step.text


def test_served_non_finite_step_is_a_400_and_nan_results_are_encoded(tmp_path):
    async def scenario(server, alice):
        assert (await _post(alice, "forward_backward", inputs=ROWS)).status_code == 200
        model, name = _service_model(server), _internal(server)
        _poison_grads(model, name)
        before = _weights(model, name)
        step = await _post(alice, "clip_grad_and_step")
        unchanged = _same(_weights(model, name), before)
        norm = await _post(alice, "optim_step", adam_params={"learning_rate": 0})
        _set_weights(model, float("nan"), name)
        forward = await _post(alice, "forward_only", inputs=ROWS)
        return step, unchanged, norm, forward

    step, unchanged, norm, forward = _served(tmp_path, scenario)
    assert step.status_code == 400, step.text
    assert "gradients are not finite" in step.json()["error"] and unchanged
    assert norm.status_code == 200 and norm.json()["result"]["grad_norm"] == "NaN", norm.text
    assert forward.status_code == 200, forward.text
    result = forward.json()["result"]
    assert result["loss"] == "NaN" and set(sum(result["logprobs"], [])) == {"NaN"}


def test_twinkle_client_reads_the_non_finite_spellings_back_as_floats():
    from twinkle_client.client import non_finite_floats

    got = non_finite_floats(
        {
            "loss": "NaN",
            "logprobs": [[-1.5, "-Infinity"], [0.0, "Infinity"]],
            "metrics": {"grad_norm": "Infinity"},
            "adapter_name": "NaN",  # a name stays a name
            "adapters": ["NaN", "b"],
        }
    )
    assert math.isnan(got["loss"]) and got["metrics"]["grad_norm"] == math.inf
    assert got["logprobs"] == [[-1.5, -math.inf], [0.0, math.inf]]
    assert got["adapter_name"] == "NaN" and got["adapters"] == ["NaN", "b"]
