"""LoRA on MoE experts (``LoraConfig.target_parameters``), per tenant, against PEFT.

On ``tiny://qwen3-moe`` (4 experts, top-2, experts as 3-D parameters): Twinkle's expert adapter
has PEFT's keys and shapes, gives PEFT's logits and gradients for the same weights, saves a
directory ``peft.PeftModel`` loads, and trains in a fused pass beside tenants without expert
adapters exactly as each would alone.
"""

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.utils import set_peft_model_state_dict
from transformers import AutoModelForCausalLM

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.lora import MultiLoraExperts, RowRoute
from twinkle.model.mock import MockModel
from twinkle.sampler import TorchSampler

MODEL = "tiny://qwen3-moe"
BOTH = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.fixture(scope="module")
def twinkle_model():
    return MultiLoraTransformersModel(MODEL, device="cpu", torch_dtype=torch.float32)


@pytest.fixture
def model(twinkle_model):
    yield twinkle_model
    for name in twinkle_model.list_adapters():
        twinkle_model.remove_adapter(name)


def lora(**fields) -> LoraConfig:
    # init_lora_weights=False: B is not zero, so the expert adapters change the logits.
    base = {"r": 4, "lora_alpha": 8, "init_lora_weights": False, "target_modules": ["q_proj"]}
    return LoraConfig(**{**base, **fields})


def peft_like(model, config: LoraConfig, state: dict[str, torch.Tensor]) -> PeftModel:
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, copy.deepcopy(config))
    result = set_peft_model_state_dict(peft_model, state)
    assert not result.unexpected_keys
    return peft_model


def shapes(state):
    return {k: tuple(v.shape) for k, v in state.items()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize(
    "targets", [BOTH, ["down_proj"], ["gate_up_proj"]], ids=["both", "down", "gate_up"]
)
def test_keys_shapes_and_logits_match_peft(model, targets):
    config = lora(target_parameters=targets)
    model.add_adapter_to_model("t", config)
    ours = model.adapter_state_dict("t")
    peft_model = peft_like(model, config, ours).eval()
    assert shapes(ours) == shapes(get_peft_model_state_dict(peft_model))
    assert any(".experts." in k for k in ours)
    ids = make_batch(rows=2, seq=12, seed=3)["input_ids"]
    with torch.no_grad():
        with model.routes([RowRoute("t", 0, 2)]):
            logits = model.model(input_ids=ids).logits
        theirs = peft_model(input_ids=ids).logits
        bare = model.model(input_ids=ids).logits
    assert rel(logits, bare) > 1e-3  # the expert adapters do change the output
    torch.testing.assert_close(logits, theirs, rtol=1e-5, atol=1e-5)


def test_gradients_match_peft(model):
    config = lora(target_parameters=BOTH, target_modules=[])
    model.add_adapter_to_model("t", config)
    batch = make_batch(rows=2, seq=12, seed=5)
    out = model.forward_backward(inputs=batch, adapter_name="t")
    ours = {k: p.grad.clone() for k, p in _named(model, "t").items()}
    assert set(ours) and all(".experts." in k for k in ours)
    peft_model = peft_like(model, config, model.adapter_state_dict("t")).train()
    labels = batch["labels"]
    logits = peft_model(input_ids=batch["input_ids"]).logits[:, :-1].float()
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
    )
    loss.backward()
    assert float(out["loss"]) == pytest.approx(float(loss.detach()), rel=1e-5)
    theirs = {
        k.replace(".default", ""): p.grad
        for k, p in peft_model.named_parameters()
        if p.requires_grad and ".experts." in k
    }
    for key, grad in ours.items():
        assert float(grad.norm()) > 0, key
        assert rel(grad, theirs[key]) < 1e-5, key


def _named(model, name):
    """Tenant ``name``'s parameters under PEFT's saved keys (``...lora_A.weight``)."""
    return dict(zip(model.adapter_state_dict(name), model.tenant(name).params, strict=True))


def test_saved_adapter_loads_in_peft(model, tmp_path):
    config = lora(target_parameters=BOTH)
    model.add_adapter_to_model("t", config)
    model.save("ckpt", output_dir=str(tmp_path), adapter_name="t")
    path = next(p.parent for p in tmp_path.rglob("adapter_config.json"))
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(path)).eval()
    ids = make_batch(rows=2, seq=10, seed=7)["input_ids"]
    with torch.no_grad():
        with model.routes([RowRoute("t", 0, 2)]):
            ours = model.model(input_ids=ids).logits
        theirs = loaded(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_fused_pass_equals_each_tenant_alone(model):
    """An expert tenant, a dense-only tenant and a second expert tenant of another rank in one
    fused pass: each one's loss and gradients equal its own pass's (1e-5 relative)."""
    configs = {
        "experts": lora(target_parameters=BOTH),
        "dense": lora(r=8, target_modules="all-linear"),
        "down": lora(r=2, target_parameters=["down_proj"], target_modules=[]),
    }
    batches = {name: make_batch(rows=2, seq=12, seed=i) for i, name in enumerate(configs)}
    for name, config in configs.items():
        model.add_adapter_to_model(name, config)
    alone = {}
    for name, batch in batches.items():
        out = model.forward_backward(inputs=batch, adapter_name=name)
        alone[name] = (float(out["loss"]), [p.grad.clone() for p in model.tenant(name).params])
        model.zero_grad(adapter_name=name)
    fused = model.forward_backward_many(
        {name: {"inputs": batch} for name, batch in batches.items()}
    )
    for name in configs:
        loss, grads = alone[name]
        assert float(fused[name]["loss"]) == pytest.approx(loss, rel=1e-5)
        for got, want in zip((p.grad for p in model.tenant(name).params), grads, strict=True):
            assert float(want.norm()) > 0, name
            assert rel(got, want) < 1e-5, name


def test_step_changes_only_the_expert_tenant(model):
    model.add_adapter_to_model("t", lora(target_parameters=BOTH, init_lora_weights=True))
    before = {k: v.clone() for k, v in model.adapter_state_dict("t").items()}
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="t")
    model.forward_backward(inputs=make_batch(rows=2, seq=12), adapter_name="t")
    model.clip_grad_and_step(adapter_name="t")
    after = model.adapter_state_dict("t")
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(".experts.lora_B" in k for k in moved)
    layers = [m for m in model.model.modules() if isinstance(m, MultiLoraExperts)]
    assert len(layers) == model.model.config.num_hidden_layers


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"target_parameters": ["mlp.gate.weight"]}, "not an MoE expert weight"),
        ({"target_parameters": ["no_such_param"]}, "match no parameter"),
        ({"target_parameters": BOTH, "lora_dropout": 0.1}, "lora_dropout must be 0"),
        ({"target_parameters": "gate_up_proj,down_proj"}, "match no parameter"),
        ({"target_parameters": [3]}, "list of parameter names"),
    ],
)
def test_bad_target_parameters_are_refused_and_change_nothing(model, fields, match):
    config = {"r": 4, "lora_alpha": 8, **fields}
    with pytest.raises(InvalidArgumentError, match=match):
        model.add_adapter_to_model("t", config)
    assert model.list_adapters() == []
    assert not any(isinstance(m, MultiLoraExperts) for m in model.model.modules()) or all(
        not m.has_adapter("t") for m in model.model.modules() if isinstance(m, MultiLoraExperts)
    )


def test_a_dense_model_has_no_expert_weights():
    dense = MultiLoraTransformersModel("tiny://qwen3", device="cpu")
    with pytest.raises(InvalidArgumentError, match="match no parameter"):
        dense.add_adapter_to_model("t", {"r": 4, "target_parameters": ["gate_up_proj"]})


def test_the_mock_ignores_target_parameters_as_it_ignores_target_modules():
    mock = MockModel()
    mock.add_adapter_to_model("t", {"r": 4, "target_parameters": ["down_proj"]})
    assert mock.list_adapters() == ["t"]


def test_tinker_train_mlp_adapts_the_experts_of_an_moe_model(model):
    """The SDK's train_mlp is "the MLP layers (including MoE layers)": on an MoE base model the
    server's conversion adds the experts, which then carry the tenant's adapter."""
    from twinkle.server.tinker.convert import lora_config, lora_flags
    from twinkle.server.tinker.models import model_facts

    assert model_facts(MODEL).moe and not model_facts("tiny://qwen3").moe
    config = lora_config({"rank": 4}, moe=model_facts(MODEL).moe)
    model.add_adapter_to_model("t", config)
    keys = model.adapter_state_dict("t")
    assert any(".mlp.experts.base_layer.lora_A" in k for k in keys)
    assert any(".mlp.experts.lora_B" in k for k in keys)
    assert lora_flags(config)["train_mlp"] is True
    no_mlp = lora_config({"rank": 4, "train_mlp": False}, moe=True)
    assert "target_parameters" not in no_mlp and lora_flags(no_mlp)["train_mlp"] is False


def test_the_sampler_samples_the_expert_adapter_live_and_from_its_checkpoint(model, tmp_path):
    """The torch sampler attaches an expert adapter from a checkpoint and from the live
    trainer (prefill and one-token decode steps both route it): the same tokens and
    log-probs either way, and not the base model's."""
    model.add_adapter_to_model("t", lora(r=8, lora_alpha=64, target_parameters=BOTH))
    sampler = TorchSampler(MODEL, allowed_adapter_dirs=[tmp_path])
    prompts, greedy = [[11, 22, 33, 44], [55, 66, 77]], {"max_tokens": 5, "temperature": 0.0}

    def sample(**adapter):
        out = sampler.sample(prompts, greedy, **adapter)
        return [(s.tokens, s.logprobs) for r in out for s in r.sequences]

    live = sample(adapter_uri=sampler.load_adapter_from_model(model, "t"))
    path = model.save("s", output_dir=tmp_path, save_optimizer=False, adapter_name="t")
    saved = sample(adapter_uri=path)
    assert [t for t, _ in live] == [t for t, _ in saved]
    for (_, a), (_, b) in zip(live, saved, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-6, rtol=0)
    assert [lp for _, lp in live] != [lp for _, lp in sample()]
