"""A faulty tenant inside a fused ``forward_backward`` fails only its own request.

Three tenants' calls reach the model service together and are fused into one pass; one of them
(mallory) is faulty: a NaN loss, a crash inside its loss (a local ``Loss`` object, or a Tinker
server-side custom loss graph), or a batch too big for the device (out of memory in the forward
or half way through the backward). The fused pass fails, the scheduler reruns each tenant alone
(its stats say so), mallory's request fails with its own error, and the healthy tenants' losses,
adapter weights and Adam state after the step equal, within 1e-6 in fp32, a run in which mallory
never took part. Mallory's own gradients stay untouched.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from twinkle.loss import Loss, LossOutput
from twinkle.model import MultiLoraTransformersModel
from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.web.errors import BadRequest, InternalError, OutOfMemory

HEALTHY = ("alice", "bob")
ROWS_LIMIT = 6  # the simulated device holds at most this many rows in one pass
TOL = {"rtol": 0.0, "atol": 1e-6}


@pytest.fixture(scope="module")
def model():
    return MultiLoraTransformersModel("tiny://qwen3", torch_dtype=torch.float32)


def _features(seed: int, rows: int = 2, seq: int = 12) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        ids = rng.integers(10, 4000, size=seq).tolist()
        out.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return out


class NanLoss(Loss):
    """A local custom loss whose value is NaN (a numerically broken user loss)."""

    name = "nan_loss"

    def __call__(self, inputs):
        loss = -(inputs.logprobs * inputs.mask).sum() * float("nan")
        return LossOutput(loss, int(inputs.mask.sum()), {})


class CrashingLoss(Loss):
    """A local custom loss with a bug."""

    name = "crashing_loss"

    def __call__(self, inputs):
        raise RuntimeError("bug in the tenant's own loss")


def _graph_spec(fn) -> dict:
    handle = trace_loss(fn, {"logprobs": 1}, "session")
    graph, inputs = encode_graph(handle).model_dump(), [i.model_dump() for i in handle.inputs]
    return {"name": "custom", "graph": graph, "inputs": inputs, "values": [[], []]}


def nan_graph(logprobs):
    return torch.log(logprobs.sum() * 0.0 - 1.0), {}


def crash_graph(logprobs):
    return logprobs[1000], {}  # valid when created, out of range for every real datum


def _out_of_memory_in(model, where: str):
    """A hook that makes the base model run out of memory on more than ROWS_LIMIT rows, in the
    forward or, half way through the backward (after the upper layers' LoRA gradients were
    added), at the first decoder layer."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        rows = hidden.shape[0]
        if rows <= ROWS_LIMIT or not hidden.requires_grad:
            return None
        message = f"simulated out of memory on {rows} rows"
        if where == "forward":
            raise torch.OutOfMemoryError(message)

        def fail(grad):
            raise torch.OutOfMemoryError(message)

        hidden.register_hook(fail)
        return None

    layer = model.model.model.layers[0]
    return layer.register_forward_hook(hook)


FAULTS = {
    "nan_local_loss": BadRequest,
    "crash_local_loss": InternalError,
    "nan_custom_graph": BadRequest,
    "crash_custom_graph": BadRequest,
    "oom_forward": OutOfMemory,
    "oom_backward": OutOfMemory,
}


def _service(model, tmp_path) -> ModelService:
    for name in list(model.tenants):
        model.remove_adapter(name)
    return ModelService(
        model,
        "tiny/qwen3",
        StateRunRegistry(ServerState(MemoryStore("fault:")), tmp_path),
        max_loras=4,
        per_token_model_limit=2,
    )


def _tenant(service: ModelService, owner: str):
    return service.model.tenants[service._internal(owner, "default")]


def _snapshot(service: ModelService, owner: str) -> dict[str, torch.Tensor]:
    tenant = _tenant(service, owner)
    out = {f"w{i}": p.detach().clone() for i, p in enumerate(tenant.params)}
    for i, p in enumerate(tenant.params):
        for key, value in tenant.optimizer.state.get(p, {}).items():
            out[f"{key}{i}"] = value.detach().clone().float()
    out["micro_step"] = torch.tensor(float(tenant.micro_step))
    return out


def _grads(service: ModelService, owner: str) -> torch.Tensor:
    tenant = _tenant(service, owner)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in tenant.params])  # fmt: skip


async def _setup(service: ModelService, owner: str) -> None:
    await service.call(
        owner, "add_adapter_to_model", {"adapter_name": "default", "config": {"r": 4}}
    )
    await service.call(
        owner, "set_optimizer", {"adapter_name": "default", "optimizer": "Adam", "lr": 1e-2}
    )


def _mallory_call(service: ModelService, fault: str):
    body: dict = {"adapter_name": "default", "inputs": _features(9)}
    if fault == "nan_local_loss":
        service.model.set_loss(NanLoss(), adapter_name=service._internal("mallory", "default"))
    elif fault == "crash_local_loss":
        service.model.set_loss(CrashingLoss(), adapter_name=service._internal("mallory", "default"))
    elif fault == "nan_custom_graph":
        body["loss"] = _graph_spec(nan_graph)
    elif fault == "crash_custom_graph":
        body["loss"] = _graph_spec(crash_graph)
    else:  # out of memory: a batch bigger than the device holds, even alone
        body["inputs"] = _features(9, rows=ROWS_LIMIT + 2)
    return service.call("mallory", "forward_backward", body)


def _run(model, tmp_path, fault: str | None) -> dict:
    """Two training steps of the healthy tenants (a step with mallory's faulty call fused in, when
    ``fault``), and what they end with."""
    service = _service(model, tmp_path)

    async def scenario() -> dict:
        for owner in (*HEALTHY, *(["mallory"] if fault else [])):
            await _setup(service, owner)
        start = {o: _snapshot(service, o) for o in HEALTHY}
        losses = []
        mallory_error, mallory_grads = None, None
        for step in range(2):
            calls = [
                service.call(
                    o,
                    "forward_backward",
                    {"adapter_name": "default", "inputs": _features(10 * step + i)},
                )
                for i, o in enumerate(HEALTHY)
            ]
            if fault and step == 1:
                mallory_grads = _grads(service, "mallory")
                calls.append(_mallory_call(service, fault))
            results = await asyncio.gather(*calls, return_exceptions=True)
            if fault and step == 1:
                mallory_error = results.pop()
            losses.append([r["loss"] for r in results])
            await asyncio.gather(
                *[
                    service.call(o, "clip_grad_and_step", {"adapter_name": "default"})
                    for o in HEALTHY
                ]
            )
        return {
            "start": start,
            "end": {o: _snapshot(service, o) for o in HEALTHY},
            "losses": losses,
            "mallory_error": mallory_error,
            "mallory_grads_before": mallory_grads,
            "mallory_grads_after": _grads(service, "mallory") if fault else None,
            "status": service.status(),
        }

    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    return _run(model, tmp_path_factory.mktemp("ref"), None)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_faulty_tenant_fails_alone_and_changes_no_other_tenant(model, reference, tmp_path, fault):
    hook = _out_of_memory_in(model, fault.split("_")[1]) if fault.startswith("oom") else None
    try:
        run = _run(model, tmp_path, fault)
    finally:
        if hook is not None:
            hook.remove()
    # The faulty call was really fused with the healthy ones: its pass failed and was rerun
    # tenant by tenant; every other forward_backward ran fused.
    assert reference["status"]["fused_passes"] == 2 and reference["status"]["fused_fallbacks"] == 0
    assert run["status"]["fused_fallbacks"] == 1
    assert run["status"]["fused_passes"] == 1  # step 0 only; step 1 ran tenant by tenant
    assert run["status"]["fused_steps"] == 2  # the healthy tenants' optimizer steps, batched
    error = run["mallory_error"]
    assert isinstance(error, FAULTS[fault]), repr(error)
    if FAULTS[fault] is BadRequest:
        assert "nothing was applied" in str(error) or "custom loss node" in str(error)
    # Mallory's failed request left its own gradients as they were (none).
    assert torch.equal(run["mallory_grads_after"], run["mallory_grads_before"])
    assert not run["mallory_grads_after"].any()
    for owner in HEALTHY:
        for key, value in run["start"][owner].items():
            assert torch.equal(value, reference["start"][owner][key]), (owner, key)
        for key, value in run["end"][owner].items():
            torch.testing.assert_close(value, reference["end"][owner][key], **TOL, msg=key)
        assert not torch.equal(run["end"][owner]["w0"], run["start"][owner]["w0"])
    np.testing.assert_allclose(run["losses"], reference["losses"], rtol=0, atol=1e-6)


class _BrokenOptimizer(torch.optim.SGD):
    """A tenant's own optimizer class that fails in its step (not batchable: stepped alone)."""

    def step(self, closure=None):
        raise RuntimeError("bug in the tenant's own optimizer")


def test_a_failed_batched_step_moves_no_accumulation_window(model):
    """A batched clip_grad_and_step that fails for one tenant leaves every tenant's progress as it
    was, so the rerun tenant by tenant counts each accumulation step once."""
    for name in list(model.tenants):
        model.remove_adapter(name)
    model.add_adapter_to_model("healthy", {"r": 4}, gradient_accumulation_steps=2)
    model.add_adapter_to_model("broken", {"r": 4})
    model.set_optimizer(_BrokenOptimizer, adapter_name="broken", lr=0.1)
    batch = {"inputs": _features(1)}
    model.forward_backward_many({"healthy": dict(batch), "broken": dict(batch)})
    with pytest.raises(RuntimeError, match="own optimizer"):
        model.clip_grad_and_step_many(["healthy", "broken"])
    assert model.tenants["healthy"].micro_step == 0
    assert model.clip_grad_and_step_many(["healthy"]) == {"healthy": False}  # 1 of 2
    model.forward_backward_many({"healthy": dict(batch)})
    assert model.clip_grad_and_step_many(["healthy"]) == {"healthy": True}  # 2 of 2
