"""Qwen3-MoE on the megatron backend: HF logit parity, multi-LoRA on attention, refusals, and
dp=2 replicas equal to the transformers backend (expert parallel: test_megatron_ep.py)."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from tests.twinkle.model.megatron._equivalence import (  # noqa: E402
    TENANTS,
    make_batch,
    train_expert_tenants,
)
from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.hub import load_config  # noqa: E402
from twinkle.model.lora import RowRoute  # noqa: E402
from twinkle.model.megatron import _build, _moe  # noqa: E402

MOE = "tiny://qwen3-moe"


@pytest.fixture(scope="module")
def moe_model():
    from twinkle.model.megatron import MultiLoraMegatronModel

    model = MultiLoraMegatronModel(MOE)
    yield model
    for name in list(model.tenants):
        model.remove_adapter(name)


@pytest.fixture(scope="module")
def hf_moe():
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_model_dir

    return AutoModelForCausalLM.from_pretrained(resolve_model_dir(MOE)).eval()


@pytest.fixture
def model(moe_model):
    yield moe_model
    for name in list(moe_model.tenants):
        moe_model.remove_adapter(name)


def test_the_megatron_layers_are_moe_with_qwen3_moe_routing(model):
    config = model.model.gpt.config
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (
        4,
        2,
        32,
    )
    assert config.moe_router_pre_softmax is False  # norm_topk_prob: top-k renormalised
    assert config.moe_router_load_balancing_type == "none" and config.moe_aux_loss_coeff == 0
    mlp = model.model.gpt.decoder.layers[0].mlp
    assert type(mlp).__name__ == "MoELayer" and len(mlp.experts.local_experts) == 4


def test_logits_equal_the_hf_model(model, hf_moe):
    ids = make_batch(3, 16, 1)["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # right padding
    with torch.no_grad():
        ours = model.model(input_ids=ids, attention_mask=mask).logits
        theirs = hf_moe(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1, :11], theirs[1, :11], rtol=1e-5, atol=1e-5)


def test_without_norm_topk_prob_the_logits_equal_the_hf_model_too(tmp_path):
    """``norm_topk_prob: false`` (softmax over all experts, top-k not renormalised) maps to
    megatron's pre-softmax routing."""
    import shutil

    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_model_dir
    from twinkle.model.megatron import MultiLoraMegatronModel

    local = tmp_path / "moe"
    shutil.copytree(resolve_model_dir(MOE), local)
    config = json.loads((local / "config.json").read_text())
    (local / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    ours_model = MultiLoraMegatronModel(str(local))
    assert ours_model.model.gpt.config.moe_router_pre_softmax is True
    ids = make_batch(2, 12, 4)["input_ids"]
    with torch.no_grad():
        ours = ours_model.model(input_ids=ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(local).eval()(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_attention_lora_trains_and_loads_in_peft(model, hf_moe, tmp_path):
    from peft import PeftModel

    model.add_adapter_to_model("p", {"r": 8, "lora_alpha": 16, "init_lora_weights": False})
    keys = model.adapter_state_dict("p")
    assert len(keys) == 2 * 4 * 2  # A and B of q/k/v/o in 2 layers: no expert or router LoRA
    assert not any(".mlp." in k for k in keys)
    model.set_optimizer("Adam", adapter_name="p", lr=1e-2)
    batch = make_batch(2, 12, 3)
    losses = []
    for _ in range(4):
        losses.append(model.forward_backward(batch, adapter_name="p")["loss"])
        assert model.clip_grad_and_step(adapter_name="p")
    assert losses[-1] < losses[0] - 0.1
    path = model.save("peft", output_dir=tmp_path, adapter_name="p")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    ids = make_batch(2, 10, 9)["input_ids"]
    with torch.no_grad(), model.routes([RowRoute("p", 0, ids.shape[0])]):
        ours = model.model(input_ids=ids).logits
    peft_model = PeftModel.from_pretrained(hf_moe, path).eval()
    try:
        with torch.no_grad():
            theirs = peft_model(input_ids=ids).logits
    finally:
        peft_model.unload()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "target", [["q_proj", "gate_proj"], ["experts"], ["gate"], ".*experts.*", ".*mlp.gate"]
)
def test_lora_on_experts_or_router_is_refused_naming_target_modules(model, target):
    with pytest.raises(InvalidArgumentError, match="target_modules.*router/experts"):
        model.add_adapter_to_model("x", {"r": 4, "target_modules": target})
    assert "x" not in model.tenants


def test_expert_lora_equals_the_transformers_backend(model, tmp_path):
    """LoRA on the experts (target_parameters) through megatron's router, dispatcher and
    SequentialMLP: losses and post-step adapters equal the transformers backend's (1e-4), and
    the checkpoint has its PEFT keys."""
    from tests.twinkle.model.megatron._equivalence import assert_expert_run_equal
    from twinkle.model import MultiLoraTransformersModel

    reference = MultiLoraTransformersModel(MOE, device="cpu", torch_dtype=torch.float32)
    expected = train_expert_tenants(reference, tmp_path / "ref")
    assert_expert_run_equal(expected, train_expert_tenants(model, tmp_path / "megatron"))


def test_each_expert_parallel_rank_loads_its_experts(monkeypatch):
    from megatron.core import parallel_state as ps

    config = load_config(MOE)
    hf = {"model.layers.1.mlp.gate.weight": torch.zeros(4, 64)}
    for e in range(4):
        for part in ("gate_proj", "up_proj", "down_proj"):
            hf[f"model.layers.1.mlp.experts.{e}.{part}.weight"] = torch.full((2, 2), float(e))
    monkeypatch.setattr(ps, "get_expert_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(ps, "get_expert_model_parallel_rank", lambda: 1)
    got = _moe.expert_weights(hf, 1, "decoder.layers.1.", config)
    fc1 = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc1.weight"
    assert sorted(got) == sorted(
        ["decoder.layers.1.mlp.router.weight"]
        + [fc1.format(j) for j in (0, 1)]
        + [fc1.format(j).replace("fc1", "fc2") for j in (0, 1)]
    )
    # rank 1 of 2: local experts 0 and 1 are global experts 2 and 3; fc1 = [gate; up].
    assert got[fc1.format(0)].shape == (4, 2) and bool((got[fc1.format(0)] == 2).all())
    assert bool((got[fc1.format(1).replace("fc1", "fc2")] == 3).all())


def test_moe_checks_name_the_field():
    config = load_config(MOE)
    _build.check_supported(config, MOE)
    with pytest.raises(ValueError, match="tp_size 2 with the MoE model"):
        _build.check_tp(config, MOE, 2)
    with pytest.raises(ValueError, match="ep_size 3 does not divide .*num_experts \\(4\\)"):
        _moe.check_moe(config, MOE, ep_size=3)
    with pytest.raises(ValueError, match="ep_size 2 > 1 needs an MoE model"):
        _moe.check_moe(load_config("tiny://qwen3"), "tiny://qwen3", ep_size=2)
    mixed = load_config(MOE)
    mixed.mlp_only_layers = [0]
    with pytest.raises(ValueError, match="mixes dense and MoE layers"):
        _build.check_supported(mixed, MOE)


@pytest.mark.slow
def test_dp2_replicas_of_the_moe_model_equal_the_transformers_backend():
    """``dp_size: 2`` (each Ray replica the whole MoE model, ep 1; check-config accepts it):
    rows split 2/1, two clipped Adam steps per tenant, equal to one transformers model."""
    import twinkle
    from tests.twinkle.model.megatron._equivalence import assert_rel_close
    from tests.twinkle.model.megatron.test_megatron_dp import train
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.parallel import DataParallelModel, DeviceGroup

    ref_losses, ref_states = train(MultiLoraTransformersModel(MOE))
    context = twinkle.initialize(
        mode="ray", groups=[DeviceGroup("dp", ranks=2, device_type="cpu", num_cpus=0.5)]
    )
    try:
        dp = DataParallelModel(MOE, dp_size=2, device_group="dp", model_backend="megatron")
        try:
            losses, states = train(dp)
        finally:
            dp.shutdown()
    finally:
        context.shutdown()
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for name in TENANTS:
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(torch.as_tensor(states[name][key]), want)
