"""The megatron-core backend on CPU: HF parity, training, isolation, fusion, PEFT, the seed flow."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from twinkle.model.lora import RowRoute


def make_batch(rows=4, seq=16, seed=0, vocab=4000):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def lora(r=8, **extra):
    return {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear", **extra}


def test_logits_equal_the_hf_model(model, hf_model):
    ids = make_batch(rows=3, seed=1)["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # right padding
    with torch.no_grad():
        ours = model.model(input_ids=ids, attention_mask=mask).logits
        theirs = hf_model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1, :11], theirs[1, :11], rtol=1e-5, atol=1e-5)


def test_training_lowers_the_loss(model):
    model.add_adapter_to_model("t", lora())
    model.set_optimizer("Adam", adapter_name="t", lr=1e-2)
    batch = make_batch()
    losses = []
    for _ in range(6):
        losses.append(model.forward_backward(batch, adapter_name="t")["loss"])
        assert model.clip_grad_and_step(adapter_name="t")
    assert losses[-1] < losses[0] - 0.5
    assert model.calculate_metric(adapter_name="t").result["step"] == 6


def test_tenants_are_isolated_bitwise(model):
    model.add_adapter_to_model("a", lora(4))
    model.add_adapter_to_model("b", lora(8, init_lora_weights=False))
    probe = make_batch(seed=5)
    before_state = model.adapter_state_dict("b")
    before = model.forward_only(probe, adapter_name="b")
    model.set_optimizer("AdamW", adapter_name="a", lr=1e-2)
    for i in range(3):
        model.forward_backward(make_batch(seed=i), adapter_name="a")
        model.clip_grad_and_step(adapter_name="a")
    after = model.forward_only(probe, adapter_name="b")
    assert after["loss"] == before["loss"]
    for x, y in zip(before["logprobs"], after["logprobs"]):
        assert (x == y).all()
    for key, value in model.adapter_state_dict("b").items():
        assert torch.equal(value, before_state[key])
    assert all(p.grad is None for p in model.tenants["b"].params)


def test_fused_pass_equals_separate_passes(model):
    # Heterogeneous ranks and partial targets (q/v only for one tenant); same seeds -> same init.
    for name, seed in (("fa", 1), ("sa", 1)):
        model.add_adapter_to_model(name, lora(4, init_lora_weights=False), seed=seed)
    for name, seed in (("fb", 2), ("sb", 2)):
        config = lora(8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
        model.add_adapter_to_model(name, config, seed=seed)
    ba, bb = make_batch(rows=3, seq=16, seed=7), make_batch(rows=2, seq=12, seed=8)
    fused = model.forward_backward_many({"fa": {"inputs": ba}, "fb": {"inputs": bb}})
    alone_a = model.forward_backward(ba, adapter_name="sa")
    alone_b = model.forward_backward(bb, adapter_name="sb")
    assert fused["fa"]["loss"] == pytest.approx(alone_a["loss"], rel=1e-5)
    assert fused["fb"]["loss"] == pytest.approx(alone_b["loss"], rel=1e-5)
    for f, s in (("fa", "sa"), ("fb", "sb")):
        for pf, ps in zip(model.tenants[f].params, model.tenants[s].params):
            torch.testing.assert_close(pf.grad, ps.grad, rtol=1e-5, atol=1e-6)
            assert pf.grad.abs().sum() > 0


def test_saved_adapter_loads_in_peft_on_the_hf_model(model, hf_model, tmp_path):
    from peft import PeftModel

    model.add_adapter_to_model("p", lora(8, init_lora_weights=False))
    path = model.save("peft", output_dir=tmp_path, adapter_name="p")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    keys = model.adapter_state_dict("p")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    ids = make_batch(seed=9)["input_ids"]
    with torch.no_grad(), model.routes([RowRoute("p", 0, ids.shape[0])]):
        ours = model.model(input_ids=ids).logits
    peft_model = PeftModel.from_pretrained(hf_model, path).eval()
    try:
        with torch.no_grad():
            theirs = peft_model(input_ids=ids).logits
    finally:
        peft_model.unload()  # give the shared HF fixture back without adapters
    with torch.no_grad():
        base = model.model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - base).abs().max() > 1e-3


def test_seed_megatron_client_flow_save_load_and_resume(model, tmp_path):
    """The seed's megatron client code: no set_loss, 'default' optimizer and scheduler."""
    model.add_adapter_to_model("m", lora(), gradient_accumulation_steps=2)
    model.set_optimizer("default", adapter_name="m", lr=1e-4)
    model.set_lr_scheduler("default", adapter_name="m", lr_decay_steps=1000, max_lr=1e-4)
    batches = [make_batch(seed=i) for i in range(6)]
    for batch in batches[:4]:
        model.forward_backward(batch, adapter_name="m")
        model.clip_grad_and_step(adapter_name="m")
    metric = model.calculate_metric(adapter_name="m").result
    assert metric["step"] == 2 and metric["lr"] == pytest.approx(1e-4 * (1 - 2 / 1000))
    configs = model.get_train_configs("m").model_dump()
    assert configs["optimizer"]["name"] == "default" and configs["loss"]["name"]
    assert isinstance(model.tenants["m"].optimizer, torch.optim.Adam)
    path = model.save("ckpt", output_dir=tmp_path, save_optimizer=True, adapter_name="m")

    model.add_adapter_to_model("r", lora(), gradient_accumulation_steps=2)
    progress = model.resume_from_checkpoint(path, adapter_name="r")
    assert progress["cur_step"] == 2
    model.add_adapter_to_model("w", lora())
    model.load(path, adapter_name="w")
    saved = model.adapter_state_dict("m")
    assert all(torch.equal(v, saved[k]) for k, v in model.adapter_state_dict("w").items())
    for name in ("m", "r"):
        for batch in batches[4:]:
            model.forward_backward(batch, adapter_name=name)
            model.clip_grad_and_step(adapter_name=name)
    m, r = model.adapter_state_dict("m"), model.adapter_state_dict("r")
    assert all(torch.equal(m[k], r[k]) for k in m)  # resumed == uninterrupted, bitwise
    assert model.calculate_metric(adapter_name="r").result["step"] == 3


def test_only_adam_optimizers(model):
    model.add_adapter_to_model("o", lora())
    with pytest.raises(ValueError, match="supports Adam optimizers only"):
        model.set_optimizer("SGD", adapter_name="o", lr=0.1)
    with pytest.raises(ValueError, match="supports Adam optimizers only"):
        model.set_optimizer(torch.optim.SGD, adapter_name="o", lr=0.1)
    model.set_optimizer(torch.optim.AdamW, adapter_name="o", lr=1e-3)
    assert isinstance(model.tenants["o"].optimizer, torch.optim.AdamW)


def test_qwen3_5_is_refused_with_a_clear_error():
    from twinkle.model.megatron import MultiLoraMegatronModel

    with pytest.raises(ValueError, match="linear-attention.*Use backend 'transformers'"):
        MultiLoraMegatronModel("tiny://qwen3.5")
