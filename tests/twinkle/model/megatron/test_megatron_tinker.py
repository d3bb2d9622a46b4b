"""The real Tinker SDK (0.38) against a ``backend: megatron``, ``device_mesh.tp_size: 2`` server
over HTTP: two tenants of different ranks train with cross-entropy, save and load their state,
and sample (from a sampler checkpoint, a snapshot and the inflight live adapter)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")
tinker = pytest.importorskip("tinker")

from twinkle.server.testing import KEYS, config_dict, serve_in_thread  # noqa: E402

BASE = "tiny/qwen3"
SEQ = np.random.default_rng(3).integers(10, 4000, size=16).tolist()


def _datum(tokens: list[int]):
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def _tp2_server(tmp_path, mesh: dict | None = None):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    config = config_dict(
        model_id="tiny://qwen3",
        backend="megatron",
        sampler=True,
        server_args={"server_config": {"per_token_model_limit": 4, "supported_models": [BASE]}},
        device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", **(mesh or {"tp_size": 2})},
    )
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore("mtk:"))


def _logprobs(client, tokens: list[int]) -> list[float]:
    """The training model's logprobs of ``tokens[1:]`` (what compute_logprobs reports)."""
    out = client.forward([_datum(tokens)], "cross_entropy").result(timeout=300)
    return out.loss_fn_outputs[0]["logprobs"].tolist()


def _train(client, steps: int, lr: float = 2e-2) -> list[float]:
    from tinker import types

    data = [_datum(SEQ), _datum(SEQ[:10])]
    losses = []
    for _ in range(steps):
        fwd = client.forward_backward(data, "cross_entropy")
        opt = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fwd.result(timeout=300).metrics["loss:sum"])
        assert opt.result(timeout=300).metrics["grad_norm:mean"] > 0
    return losses


def _tenant_flow(service, rank: int, tag: str, **lora) -> dict:
    """One tenant's whole SDK loop; returns what the caller compares across tenants."""
    from tinker import types

    client = service.create_lora_training_client(
        base_model=BASE, rank=rank, seed=rank, **lora
    ).result(timeout=300)
    losses = _train(client, 4)
    assert losses[-1] < losses[0], losses

    # save_state / load_state: a step after the save is undone by loading it back.
    state_path = client.save_state(f"{tag}-state").result(timeout=300).path
    saved = _logprobs(client, SEQ[:8])
    _train(client, 1, lr=0.2)
    moved = _logprobs(client, SEQ[:8])
    assert max(abs(a - b) for a, b in zip(saved, moved)) > 1e-3
    client.load_state(state_path).result(timeout=300)
    np.testing.assert_allclose(_logprobs(client, SEQ[:8]), saved, atol=1e-5)

    prompt = types.ModelInput.from_ints(SEQ[:8])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=1)

    # A sampler checkpoint, sampled by path: the sampler (HF + PEFT) sees the megatron adapter.
    sampler_path = client.save_weights_for_sampler(f"{tag}-sampler").result(timeout=300).path
    by_path = service.create_sampling_client(model_path=sampler_path)
    got = by_path.compute_logprobs(prompt).result(timeout=300)
    np.testing.assert_allclose(got[1:], saved, atol=1e-3)
    out = by_path.sample(prompt, num_samples=2, sampling_params=params).result(timeout=300)
    assert len(out.sequences) == 2 and all(1 <= len(s.tokens) <= 4 for s in out.sequences)

    # A snapshot and the inflight live adapter, each sampling this step's weights.
    snapshot = client.save_weights_and_get_sampling_client().result(timeout=300)
    np.testing.assert_allclose(
        snapshot.compute_logprobs(prompt).result(timeout=300)[1:], saved, atol=1e-3
    )
    inflight = client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=300)
    np.testing.assert_allclose(
        inflight.compute_logprobs(prompt).result(timeout=300)[1:], saved, atol=1e-3
    )
    _train(client, 1, lr=0.2)
    trained = _logprobs(client, SEQ[:8])
    client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=300)
    # The shared inflight target moved: the old inflight client samples the new step.
    np.testing.assert_allclose(
        inflight.compute_logprobs(prompt).result(timeout=300)[1:], trained, atol=1e-3
    )
    out = inflight.sample(prompt, num_samples=1, sampling_params=params).result(timeout=300)
    assert 1 <= len(out.sequences[0].tokens) <= 4
    return {"losses": losses, "logprobs": trained}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [{"tp_size": 2}, {"pp_size": 2}], ids=["tp2", "pp2"])
def test_tinker_sdk_trains_two_tenants_on_a_tp2_megatron_server(tmp_path, mesh):
    """tp=2, and pp=2: there Tinker's default adapter (train_unembed=True) has its LM head part on
    the last stage and its layers on both."""
    from twinkle.model.megatron.parallel import ParallelMegatronModel
    from twinkle_client import init_tinker_client

    init_tinker_client()
    server = _tp2_server(tmp_path, mesh)
    model = server.services["model"].model
    try:
        assert isinstance(model, ParallelMegatronModel)
        assert (model.tp_size, model.pp_size) == (mesh.get("tp_size", 1), mesh.get("pp_size", 1))
        with serve_in_thread(server.app) as url:
            alice = tinker.ServiceClient(base_url=url, api_key=KEYS["alice"])
            bob = tinker.ServiceClient(base_url=url, api_key=KEYS["bob"])
            try:
                # Tinker's default (train_unembed=True) adapts the LM head too, on tp=2 as well:
                # trains, saves, loads and samples (the sampler's HF + PEFT sees the head).
                a = _tenant_flow(alice, 4, "a")
                (alice_adapter,) = model.list_adapters()
                b = _tenant_flow(bob, 8, "b", train_unembed=False)
                (bob_adapter,) = set(model.list_adapters()) - {alice_adapter}
                head = "base_model.model.lm_head.lora_B.weight"
                assert head in model.adapter_state_dict(adapter_name=alice_adapter)
                assert not any("lm_head" in k for k in model.adapter_state_dict(bob_adapter))
                assert server.services["model"].status()["adapters"] == 2
            finally:
                for service in (alice, bob):
                    service.close("success").result(timeout=60)
    finally:
        model.close()
    # Two tenants, different ranks and seeds: different adapters, each trained on its own.
    assert a["losses"] != b["losses"]
    assert a["logprobs"] != b["logprobs"]


def test_inflight_adapter_state_of_a_model_whose_tenants_live_in_its_ranks():
    """Regression: ``tinker_adapter_state`` asked the model for ``tenant(...)``, which a
    ``ParallelMegatronModel`` (tenants in its rank processes) has not: inflight sampling on a
    tp > 1 server was a 500. Now it reads only what the ranks answer (rank 0's whole adapter)."""
    import base64

    import torch
    from safetensors.torch import load as load_tensors

    from twinkle.model.megatron.parallel import ParallelMegatronModel
    from twinkle.server.model.protocol import Call, Empty
    from twinkle.server.model.tinker_weights_ops import tinker_adapter_state

    weights = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.ones(4, 8)}

    class Ranks(ParallelMegatronModel):  # the driver's surface, without spawning ranks
        def __init__(self):
            self._ranks = None  # no ranks: call() is answered here

        def call(self, name, *args, **kwargs):
            assert name in ("adapter_state_dict", "adapter_peft_config"), name
            return dict(weights) if name == "adapter_state_dict" else {"r": 4}

    service = type("Service", (), {"model": Ranks()})()
    out = tinker_adapter_state(service, Call(owner="o", name="a", internal="o-a"), Empty())
    assert out["config"] == {"r": 4} and out["step"] is None
    got = load_tensors(base64.b64decode(out["weights_b64"]))
    assert got.keys() == weights.keys() and torch.equal(*got.values(), *weights.values())
