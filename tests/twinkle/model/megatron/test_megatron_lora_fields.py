"""The megatron backend honours and refuses LoraConfig fields as the transformers backend does,
LM head included (its logits equal peft's on the HF model)."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.model.lora import RowRoute  # noqa: E402


@pytest.mark.parametrize(
    "config",
    [
        {"use_dora": True},
        {"init_lora_weights": "pissa"},
        {"modules_to_save": ["lm_head"]},
    ],
)
def test_refused_fields_are_named(model, config):
    field = next(iter(config)) if "target_modules" not in config else "target_modules"
    with pytest.raises(InvalidArgumentError, match=field):
        model.add_adapter_to_model("t", {"r": 4, **config})
    assert model.list_adapters() == []


def test_patterns_and_layer_selection_match_peft(model, hf_model):
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2},
        alpha_pattern={"down_proj": 32},
        layers_to_transform=[1],
        use_rslora=True,
        init_lora_weights=False,
    )
    model.add_adapter_to_model("t", config)
    ours = model.adapter_state_dict("t")
    assert all(".layers.1." in k for k in ours)
    assert ours["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"].shape[0] == 2
    from peft.utils import set_peft_model_state_dict

    peft_model = get_peft_model(hf_model, config)
    try:
        set_peft_model_state_dict(peft_model, ours)
        ids = torch.randint(10, 4000, (2, 12), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            theirs = peft_model.eval()(input_ids=ids).logits
            with model.routes([RowRoute("t", 0, 2)]):
                logits = model.model(input_ids=ids).logits
    finally:
        peft_model.unload()
    torch.testing.assert_close(logits, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("selector", [["q_proj", "lm_head"], "lm_head|.*q_proj"])
def test_the_lm_head_is_adapted_as_peft_adapts_it(model, hf_model, selector):
    # tiny://qwen3 ties lm_head to the embedding: peft wraps lm_head anyway, so do we.
    config = LoraConfig(r=4, lora_alpha=8, target_modules=selector, init_lora_weights=False)
    model.add_adapter_to_model("t", config)
    ours = model.adapter_state_dict("t")
    assert "base_model.model.lm_head.lora_B.weight" in ours
    from peft.utils import set_peft_model_state_dict

    peft_model = get_peft_model(hf_model, config)
    try:
        assert {k for k in peft_model.state_dict() if "lora_" in k} == {
            k.replace(".weight", ".default.weight") for k in ours
        }
        set_peft_model_state_dict(peft_model, ours)
        ids = torch.randint(10, 4000, (2, 12), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            theirs = peft_model.eval()(input_ids=ids).logits
            with model.routes([RowRoute("t", 0, 1)]):  # row 1 has no adapter: base logits
                logits = model.model(input_ids=ids).logits
            with peft_model.disable_adapter():
                base = peft_model(input_ids=ids).logits
    finally:
        peft_model.unload()
    assert not torch.allclose(theirs, base, atol=1e-3)  # the adapter moves the logits
    torch.testing.assert_close(logits[:1], theirs[:1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1:], base[1:], rtol=1e-5, atol=1e-5)
