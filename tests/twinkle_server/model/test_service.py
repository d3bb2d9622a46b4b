"""ModelService: per-tenant queues, fused forward_backward, isolation, limits, lifecycle."""

import asyncio

import numpy as np
import pytest

from twinkle.model import MultiLoraTransformersModel
from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.ratelimit import RateLimiter
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.web.errors import AtCapacity, BadRequest, NotFound, RateLimited


def _features(seed, rows=2, seq=12):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        ids = rng.integers(10, 4000, size=seq).tolist()
        out.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return out


@pytest.fixture(scope="module")
def shared_model():
    return MultiLoraTransformersModel("tiny://qwen3")


@pytest.fixture
def service(shared_model, tmp_path):
    for name in list(shared_model.tenants):
        shared_model.remove_adapter(name)
    return ModelService(
        shared_model,
        "tiny/qwen3",
        StateRunRegistry(ServerState(MemoryStore("svc:")), tmp_path),
        max_loras=3,
        per_token_model_limit=2,
    )


def run(coro):
    return asyncio.run(coro)


async def _setup(service, owner, name, rank=8, lr=1e-2):
    await service.call(
        owner,
        "add_adapter_to_model",
        {"adapter_name": name, "config": {"r": rank, "lora_alpha": 2 * rank}},
    )
    await service.call(
        owner, "set_optimizer", {"adapter_name": name, "optimizer": "Adam", "lr": lr}
    )


def test_concurrent_tenants_are_fused_and_match_separate_results(service):
    async def scenario():
        await _setup(service, "alice", "default")
        await _setup(service, "bob", "default", rank=16)
        calls = [
            service.call(o, "forward_backward", {"adapter_name": "default", "inputs": _features(i)})
            for i, o in enumerate(["alice", "bob"])
        ]
        fused = await asyncio.gather(*calls)
        return fused

    fused = run(scenario())
    assert service.scheduler.fused_passes == 1
    # Alice's adapter is alone in her request: the fused result equals a forward_only on it.
    assert fused[0]["loss"] > 0 and fused[1]["loss"] > 0
    assert len(fused[0]["logprobs"]) == 2


def test_concurrent_optimizer_steps_are_batched(service):
    """Waiting clip_grad_and_step calls of several tenants run as one batched step; calls whose
    arguments differ run one by one. Either way every tenant steps exactly once."""

    async def scenario(norms):
        await asyncio.gather(
            *(
                service.call(
                    o, "forward_backward", {"adapter_name": "default", "inputs": _features(i)}
                )
                for i, o in enumerate(["alice", "bob"])
            )
        )
        before = {o: service.model.adapter_state_dict(internal[o]) for o in ("alice", "bob")}
        stepped = await asyncio.gather(
            *(
                service.call(
                    o, "clip_grad_and_step", {"adapter_name": "default", "max_grad_norm": n}
                )
                for o, n in zip(["alice", "bob"], norms)
            )
        )
        return before, stepped

    async def setup():
        await _setup(service, "alice", "default")
        await _setup(service, "bob", "default", rank=16)

    run(setup())
    internal = {o: service._internal(o, "default") for o in ("alice", "bob")}
    for norms, batched in (((1.0, 1.0), 1), ((1.0, 0.5), 0)):
        fused_before = service.scheduler.fused_steps
        before, stepped = run(scenario(norms))
        assert stepped == [True, True]
        assert service.scheduler.fused_steps - fused_before == batched
        assert service.status()["fused_steps"] == service.scheduler.fused_steps
        for owner in ("alice", "bob"):
            tenant = service.model.tenants[internal[owner]]
            assert not tenant.pending_grads and tenant.last_grad_norm > 0
            after = service.model.adapter_state_dict(internal[owner])
            assert any(not np.allclose(after[k], before[owner][k]) for k in after)
    assert service.model.tenants[internal["alice"]].cur_step == 2


def test_same_adapter_name_under_two_keys_is_two_tenants(service):
    async def scenario():
        await _setup(service, "alice", "default")
        await _setup(service, "bob", "default")
        for _ in range(5):
            await service.call(
                "alice", "forward_backward", {"adapter_name": "default", "inputs": _features(1)}
            )
            await service.call("alice", "clip_grad_and_step", {"adapter_name": "default"})
        return (
            await service.call("alice", "calculate_metric", {"adapter_name": "default"}),
            await service.call("bob", "calculate_metric", {"adapter_name": "default"}),
        )

    alice, bob = run(scenario())
    assert alice["result"]["step"] == 5 and bob["result"]["step"] == 0


def test_errors_are_clear_and_scoped(service):
    async def scenario():
        await _setup(service, "alice", "a1")
        with pytest.raises(NotFound, match="unknown adapter 'a1'"):
            await service.call(
                "bob", "forward_backward", {"adapter_name": "a1", "inputs": _features(0)}
            )
        with pytest.raises(NotFound, match="unknown operation"):
            await service.call("alice", "rm_rf", {"adapter_name": "a1"})
        with pytest.raises(BadRequest, match="already exists"):
            await service.call(
                "alice", "add_adapter_to_model", {"adapter_name": "a1", "config": {"r": 4}}
            )
        with pytest.raises(BadRequest, match="max_lora_rank"):
            await service.call(
                "alice", "add_adapter_to_model", {"adapter_name": "big", "config": {"r": 512}}
            )
        with pytest.raises(BadRequest, match="neither input_ids nor messages"):
            await service.call(
                "alice", "forward_backward", {"adapter_name": "a1", "inputs": [{"x": 1}]}
            )
        with pytest.raises(BadRequest, match="by name"):
            await service.call(
                "alice", "set_loss", {"adapter_name": "a1", "loss": {"code": "evil"}}
            )
        with pytest.raises(BadRequest, match="invalid checkpoint name"):
            await service.call("alice", "save", {"adapter_name": "a1", "name": "../../etc"})
        with pytest.raises(NotFound):
            await service.call(
                "alice", "load", {"adapter_name": "a1", "path": "twinkle://other-run/weights/x"}
            )
        with pytest.raises(BadRequest, match="step"):
            await service.call("alice", "clip_grad_and_step", {"adapter_name": "a1"})

    run(scenario())


def test_capacity_and_per_key_limit(service):
    async def scenario():
        await _setup(service, "alice", "a1")
        await _setup(service, "alice", "a2")
        with pytest.raises(BadRequest, match="per_token_model_limit"):
            await _setup(service, "alice", "a3")
        await _setup(service, "bob", "b1")
        with pytest.raises(AtCapacity, match="max_loras=3"):
            await _setup(service, "carol", "c1")
        await service.call("bob", "remove_adapter", {"adapter_name": "b1"})
        await _setup(service, "carol", "c1")

    run(scenario())


def test_rate_limits_answer_429_with_retry_after(service):
    now = [0.0]
    service.rate_limiter = RateLimiter(rps_limit=2, max_input_tokens=30, clock=lambda: now[0])

    async def scenario():
        await _setup(service, "alice", "a1")
        with pytest.raises(BadRequest, match="max_input_tokens=30"):
            await service.call(
                "alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0, rows=3)}
            )
        await service.call("alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0)})
        await service.call("alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0)})
        with pytest.raises(RateLimited) as info:
            await service.call(
                "alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0)}
            )
        assert info.value.retry_after == pytest.approx(0.5)
        now[0] += 0.5
        await service.call("alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0)})

    run(scenario())


def test_idle_adapters_are_unloaded_with_a_clear_message(service):
    clock = [1000.0]
    service.clock = lambda: clock[0]
    service.adapter_timeout = 30

    async def scenario():
        await _setup(service, "alice", "a1")
        clock[0] += 10
        assert await service.sweep() == []
        clock[0] += 31
        assert await service.sweep() == ["a1"]
        with pytest.raises(NotFound, match="unloaded .*adapter_timeout=30"):
            await service.call(
                "alice", "forward_only", {"adapter_name": "a1", "inputs": _features(0)}
            )

    run(scenario())


def test_save_and_resume_through_twinkle_paths(service):
    async def scenario():
        await _setup(service, "alice", "a1")
        await service.call(
            "alice", "forward_backward", {"adapter_name": "a1", "inputs": _features(0)}
        )
        await service.call("alice", "clip_grad_and_step", {"adapter_name": "a1"})
        saved = await service.call(
            "alice", "save", {"adapter_name": "a1", "name": "ck-1", "save_optimizer": True}
        )
        assert saved["path"].startswith("twinkle://a1-") and saved["path"].endswith("/weights/ck-1")
        progress = await service.call(
            "alice", "resume_from_checkpoint", {"adapter_name": "a1", "path": saved["path"]}
        )
        assert progress["cur_step"] == 1
        await _setup(service, "bob", "b1")
        with pytest.raises(NotFound):
            await service.call("bob", "load", {"adapter_name": "b1", "path": saved["path"]})

    run(scenario())
