"""Every peft.LoraConfig field works as in peft, or is refused naming the field.

Accepted fields are checked against a real ``peft.PeftModel`` built on the same tiny base with the
same config and the same adapter weights: the same modules carry adapters with the same shapes,
and the logits agree to 1e-5 (float32).
"""

import copy
import dataclasses
import json
import math

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.utils import set_peft_model_state_dict
from transformers import AutoModelForCausalLM

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.lora import RowRoute, adapter_spec_from_config
from twinkle.model.lora_fields import PEFT_DEFAULTS, _same
from twinkle.model.mock import MockModel

MODEL = "tiny://qwen3"


@pytest.fixture(scope="module")
def twinkle_model():
    return MultiLoraTransformersModel(MODEL, device="cpu", torch_dtype=torch.float32)


@pytest.fixture
def model(twinkle_model):
    yield twinkle_model
    for name in twinkle_model.list_adapters():
        twinkle_model.remove_adapter(name)


def peft_model_like(model, config: LoraConfig, state: dict[str, torch.Tensor]) -> PeftModel:
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, copy.deepcopy(config))
    result = set_peft_model_state_dict(peft_model, state)
    assert not result.unexpected_keys
    return peft_model.eval()


def shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    # peft also saves a targeted (tied) LM head's base weight: compare the adapter keys only.
    return {k: tuple(v.shape) for k, v in state.items() if ".lora_" in k}


def assert_matches_peft(model, config: LoraConfig) -> PeftModel:
    """Twinkle's adapter from ``config`` and peft's: same modules, shapes and logits."""
    model.add_adapter_to_model("t", config)
    ours = model.adapter_state_dict("t")
    peft_model = peft_model_like(model, config, ours)
    assert shapes(ours) == shapes(get_peft_model_state_dict(peft_model))
    ids = make_batch(rows=2, seq=12, seed=3)["input_ids"]
    with torch.no_grad():
        with model.routes([RowRoute("t", 0, ids.shape[0])]):
            logits = model.model(input_ids=ids).logits
        theirs = peft_model(input_ids=ids).logits
    torch.testing.assert_close(logits, theirs, rtol=1e-5, atol=1e-5)
    return peft_model


def lora(**fields) -> LoraConfig:
    # init_lora_weights=False: B is not zero, so the adapter changes the logits.
    return LoraConfig(**{"r": 4, "lora_alpha": 8, "init_lora_weights": False, **fields})


# ------------------------------------------------------------------ honoured fields


def test_target_modules_list(model):
    assert_matches_peft(model, lora(target_modules=["q_proj", "down_proj"]))


def test_target_modules_regex(model):
    assert_matches_peft(model, lora(target_modules=r".*layers\.1\..*(k|up)_proj"))


def test_target_modules_all_linear_leaves_out_the_lm_head(model):
    assert_matches_peft(model, lora(target_modules="all-linear"))
    assert not any("lm_head" in k for k in model.adapter_state_dict("t"))


def test_target_modules_list_may_name_the_lm_head(model):
    assert_matches_peft(model, lora(target_modules=["v_proj", "lm_head"]))
    assert "base_model.model.lm_head.lora_A.weight" in model.adapter_state_dict("t")


def test_exclude_modules(model):
    assert_matches_peft(
        model,
        lora(
            target_modules="all-linear", exclude_modules=["model.layers.0.mlp.down_proj", "o_proj"]
        ),
    )


def test_use_rslora(model):
    peft_model = assert_matches_peft(
        model, lora(r=16, lora_alpha=8, use_rslora=True, target_modules=["q_proj"])
    )
    layer = model.model.model.layers[0].self_attn.q_proj
    theirs = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["t"] == pytest.approx(8 / math.sqrt(16)) == theirs.scaling["default"]


def test_rank_pattern_and_alpha_pattern(model):
    config = lora(
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2, r"layers\.1\.mlp\.down_proj": 6},
        alpha_pattern={"model.layers.0.self_attn.q_proj": 32},
    )
    assert_matches_peft(model, config)
    state = model.adapter_state_dict("t")
    prefix = "base_model.model.model.layers"
    assert state[f"{prefix}.0.self_attn.v_proj.lora_A.weight"].shape[0] == 2
    assert state[f"{prefix}.1.mlp.down_proj.lora_A.weight"].shape[0] == 6
    assert state[f"{prefix}.0.mlp.down_proj.lora_A.weight"].shape[0] == 4
    assert model.model.model.layers[0].self_attn.q_proj.scaling["t"] == 32 / 4


def test_layers_to_transform(model):
    assert_matches_peft(model, lora(target_modules=["q_proj", "up_proj"], layers_to_transform=[1]))
    assert all(".layers.1." in k for k in model.adapter_state_dict("t"))


def test_layers_to_transform_with_layers_pattern(model):
    assert_matches_peft(
        model,
        lora(target_modules=["k_proj"], layers_to_transform=0, layers_pattern="layers"),
    )
    assert all(".layers.0." in k for k in model.adapter_state_dict("t"))


def test_bias_none(model):
    assert_matches_peft(model, lora(bias="none", target_modules=["q_proj"]))


def test_lora_dropout_trains_like_peft_and_is_off_without_grad(model):
    config = lora(target_modules=["q_proj", "up_proj"], lora_dropout=0.3)
    peft_model = assert_matches_peft(model, config)  # no grad: no dropout, like peft.eval()
    peft_model.train()
    ids = make_batch(rows=2, seq=12, seed=4)["input_ids"]
    torch.manual_seed(11)
    with model.routes([RowRoute("t", 0, ids.shape[0])]):
        ours = model.model(input_ids=ids).logits
    torch.manual_seed(11)
    theirs = peft_model(input_ids=ids).logits
    # The same masks, drawn from the same stream in the same order.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), model.routes([RowRoute("t", 0, ids.shape[0])]):
        no_dropout = model.model(input_ids=ids).logits
    assert (ours - no_dropout).abs().max() > 1e-4


def _a_b(model, layer="q_proj"):
    module = getattr(model.model.model.layers[0].self_attn, layer)
    return module.lora_A["t"].weight, module.lora_B["t"].weight


def _peft_a_b(model, config):
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    peft_model = get_peft_model(base, copy.deepcopy(config))
    module = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    return module.lora_A["default"].weight, module.lora_B["default"].weight


@pytest.mark.parametrize("init", [True, "gaussian", False])
def test_init_lora_weights_follows_peft(model, init):
    config = LoraConfig(r=16, target_modules=["q_proj"], init_lora_weights=init)
    model.add_adapter_to_model("t", config)
    (a, b), (pa, pb) = _a_b(model), _peft_a_b(model, config)
    assert a.shape == pa.shape and b.shape == pb.shape
    in_features, r = a.shape[1], a.shape[0]
    if init == "gaussian":  # A ~ N(0, 1/r)
        expected_std = 1 / r
        assert a.std().item() == pytest.approx(expected_std, rel=0.1)
        assert pa.std().item() == pytest.approx(expected_std, rel=0.1)
    else:  # A ~ U(-1/sqrt(in), 1/sqrt(in)): Kaiming-uniform with a=sqrt(5)
        bound = 1 / math.sqrt(in_features)
        for weight in (a, pa):
            assert weight.abs().max().item() <= bound
            assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    if init is False:  # B keeps nn.Linear's init: U(-1/sqrt(r), 1/sqrt(r))
        for weight in (b, pb):
            assert 0 < weight.abs().max().item() <= 1 / math.sqrt(r)
            assert weight.std().item() == pytest.approx(1 / math.sqrt(3 * r), rel=0.2)
    else:
        assert not b.any() and not pb.any()


# ------------------------------------------------------------------- refused fields

REFUSED = [
    ("use_dora", {"use_dora": True}),
    ("init_lora_weights", {"init_lora_weights": "pissa"}),
    ("init_lora_weights", {"init_lora_weights": "pissa_niter_4"}),
    ("init_lora_weights", {"init_lora_weights": "olora"}),
    ("init_lora_weights", {"init_lora_weights": "loftq"}),
    ("init_lora_weights", {"init_lora_weights": "corda"}),
    ("init_lora_weights", {"init_lora_weights": "eva"}),
    ("init_lora_weights", {"init_lora_weights": "orthogonal"}),
    ("modules_to_save", {"modules_to_save": ["lm_head"]}),
    ("bias", {"bias": "all"}),
    ("bias", {"bias": "lora_only"}),
    ("fan_in_fan_out", {"fan_in_fan_out": True}),
    ("lora_bias", {"lora_bias": True}),
    ("trainable_token_indices", {"trainable_token_indices": [1, 2]}),
    ("layer_replication", {"layer_replication": [[0, 2]]}),
    ("use_qalora", {"use_qalora": True}),
    ("loftq_config", {"loftq_config": {"loftq_bits": 4}}),
    ("alora_invocation_tokens", {"alora_invocation_tokens": [5]}),
    ("a_future_field", {"a_future_field": 3}),
    ("layers_to_transform", {"target_modules": "all-linear", "layers_to_transform": [0]}),
    ("layers_pattern", {"target_modules": ["q_proj"], "layers_pattern": "layers"}),
]


@pytest.mark.parametrize(
    "field, config", REFUSED, ids=[f"{f}={list(c.values())[-1]}" for f, c in REFUSED]
)
def test_refused_field_is_named(model, field, config):
    with pytest.raises(InvalidArgumentError, match=field):
        model.add_adapter_to_model("t", {"r": 4, **config})
    assert model.list_adapters() == []


def test_refused_as_a_peft_config_object(model):
    with pytest.raises(InvalidArgumentError, match="use_dora=True"):
        model.add_adapter_to_model("t", LoraConfig(use_dora=True))


@pytest.mark.parametrize("field, config", REFUSED[:12])
def test_the_mock_refuses_the_same_fields(field, config):
    mock = MockModel()
    with pytest.raises(InvalidArgumentError, match=field):
        mock.add_adapter_to_model("t", {"r": 4, **config})


def test_the_mock_accepts_honoured_fields_and_scales_rslora():
    mock = MockModel()
    mock.add_adapter_to_model("t", lora(r=16, lora_alpha=8, use_rslora=True, lora_dropout=0.1))
    assert mock._adapters["t"].scale == pytest.approx(2.0)


def test_fields_left_at_defaults_pass(model):
    model.add_adapter_to_model("t", LoraConfig().to_dict())
    assert model.list_adapters() == ["t"]


def test_the_defaults_table_is_the_installed_peft():
    installed = {f.name: getattr(LoraConfig(), f.name) for f in dataclasses.fields(LoraConfig)}
    installed["runtime_config"] = dataclasses.asdict(installed["runtime_config"])
    installed["peft_type"] = installed["peft_type"].value
    for key, value in installed.items():
        if key == "peft_version":
            continue
        assert key in PEFT_DEFAULTS, f"peft's LoraConfig.{key} is not in lora_fields.PEFT_DEFAULTS"
        assert _same(value, PEFT_DEFAULTS[key]), key


# ----------------------------------------------------- a directory peft wrote, trained on


def test_a_peft_written_adapter_loads_and_trains(model, tmp_path):
    config = LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "gate_proj"],
        rank_pattern={"gate_proj": 8},
        init_lora_weights=False,
    )
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    torch.manual_seed(5)
    peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["rank_pattern"]

    model.add_adapter_to_model("t", LoraConfig.from_pretrained(tmp_path))
    model.load(tmp_path, adapter_name="t")
    ids = make_batch(rows=2, seq=12, seed=6)["input_ids"]
    with torch.no_grad():
        with model.routes([RowRoute("t", 0, ids.shape[0])]):
            ours = model.model(input_ids=ids).logits
        theirs = peft_model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)

    before = {k: v.clone() for k, v in model.adapter_state_dict("t").items()}
    model.set_optimizer("Adam", lr=1e-2, adapter_name="t")
    model.forward_backward(inputs=make_batch(rows=2, seq=12, seed=7), adapter_name="t")
    model.clip_grad_and_step(adapter_name="t")
    after = model.adapter_state_dict("t")
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_a_peft_directory_is_a_config(model, tmp_path):
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj"], rank_pattern={"q_proj": 2})
    config.save_pretrained(tmp_path)
    model.add_adapter_to_model("t", tmp_path)
    expected = adapter_spec_from_config("t", LoraConfig.from_pretrained(tmp_path), seed=model.seed)
    assert model.tenant("t").spec == expected
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        model.add_adapter_to_model("u", tmp_path / "missing")
    mock = MockModel()
    mock.add_adapter_to_model("t", str(tmp_path))
    assert mock.get_train_configs("t").model_dump()["lora"]["lora_alpha"] == 16
