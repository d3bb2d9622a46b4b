"""LoRA on the LM head (``lm_head``; Tinker's ``train_unembed``) on the megatron backend equals the
transformers backend: losses, post-step adapters and the saved PEFT checkpoint, fp32 on CPU."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from safetensors.torch import load_file  # noqa: E402

from tests.twinkle.model.megatron._equivalence import make_batch  # noqa: E402
from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.server.tinker.convert import lora_config  # noqa: E402

HEAD_KEYS = {
    "base_model.model.lm_head.lora_A.weight",
    "base_model.model.lm_head.lora_B.weight",
}


def tenants():
    """'a': Tinker's default ``create_lora_training_client(rank=4)`` (attention, MLP and the
    unembedding); 'b': 'all-linear' of rank 8 (no LM head), in the same fused passes."""
    a = {**lora_config({"rank": 4}), "lora_alpha": 8}
    assert "lm_head" in a["target_modules"]
    return {"a": (a, 1), "b": ({"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}, 2)}


def train(model, out_dir):
    """Two fused forward_backward around one fused (clipped) step; losses, adapters, checkpoint."""
    for name, (config, seed) in tenants().items():
        # B non-zero, so every LoRA weight (the head's A too) gets a gradient at the first step.
        model.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
        # eps=1: the first Adam update is proportional to g (not sign(g)), so it compares values.
        model.set_optimizer("Adam", adapter_name=name, lr=1e-2, eps=1.0)
    batch_b = make_batch(2, 10, 2)
    batch_b["attention_mask"][1, 7:] = 0
    batch_b["labels"][1, 7:] = -100
    # 'b' first: the head's tenant is not the first rows, so its rows' segment is offset.
    batches = {"b": {"inputs": batch_b}, "a": {"inputs": make_batch(3, 12, 1)}}
    first = model.forward_backward_many(batches)
    model.clip_grad_and_step_many(["a", "b"], max_grad_norm=0.5)
    second = model.forward_backward_many(batches)
    losses = [first[n]["loss"] for n in "ab"] + [second[n]["loss"] for n in "ab"]
    states = {n: model.adapter_state_dict(adapter_name=n) for n in "ab"}
    saved = model.save("ckpt", output_dir=str(out_dir), adapter_name="a")
    return losses, states, saved


def assert_rel_close(got, want, rel=1e-4):
    scale = want.abs().max().clamp_min(1e-12)
    assert float((got - want).abs().max() / scale) <= rel


def assert_equivalent(got, ref):
    losses, states, saved = got
    ref_losses, ref_states, ref_dir = ref
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert ref_losses[2] != pytest.approx(ref_losses[0], rel=1e-3)  # the step moved the adapters
    assert HEAD_KEYS <= set(ref_states["a"]) and not HEAD_KEYS & set(ref_states["b"])
    for name in "ab":
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(states[name][key], want)
    files = load_file(f"{saved}/adapter_model.safetensors")
    ref_files = load_file(f"{ref_dir}/adapter_model.safetensors")
    assert set(files) == set(ref_files) and HEAD_KEYS <= set(files)
    for key, want in ref_files.items():
        assert_rel_close(files[key], want)
    config = json.loads(open(f"{saved}/adapter_config.json").read())
    ref_config = json.loads(open(f"{ref_dir}/adapter_config.json").read())
    assert sorted(config["target_modules"]) == sorted(ref_config["target_modules"])
    assert "lm_head" in config["target_modules"]


@pytest.fixture(scope="module")
def hf_backend():
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("tiny://qwen3")
    assert model.model.config.tie_word_embeddings  # the head shares the embedding's weight
    return model


@pytest.fixture(scope="module")
def reference(hf_backend, tmp_path_factory):
    return train(hf_backend, tmp_path_factory.mktemp("hf"))


def test_lm_head_lora_equals_the_transformers_backend(model, reference, tmp_path):
    got = train(model, tmp_path)
    assert_equivalent(got, reference)
    # The tied base weight is the embedding's, untouched by the head's adapter.
    gpt = model.model.gpt
    assert gpt.share_embeddings_and_output_weights
    assert not gpt.embedding.word_embeddings.weight.requires_grad


@pytest.mark.parametrize("selector", [["lm_head"], "lm_head"])
def test_an_adapter_on_the_head_alone(model, hf_backend, selector):
    config = {"r": 2, "lora_alpha": 4, "target_modules": selector, "init_lora_weights": False}
    batch = make_batch(2, 6, 3)
    losses = []
    for backend in (model, hf_backend):
        backend.add_adapter_to_model("h", config, seed=5)
        try:
            assert set(backend.adapter_state_dict(adapter_name="h")) == HEAD_KEYS
            losses.append(backend.forward_backward(batch, adapter_name="h")["loss"])
        finally:
            backend.remove_adapter("h")
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.parametrize("selector", [["lm_head"], "lm_head", ".*head"])
def test_the_head_alone_is_refused_under_pipeline_parallel(model, monkeypatch, selector):
    """Under pp the head is the last stage's: an adapter of the head alone would leave every
    earlier stage a tenant without parameters. With layers (Tinker's default) it is accepted."""
    monkeypatch.setattr(model, "pp_size", 2)
    with pytest.raises(InvalidArgumentError, match="target_modules.*only 'lm_head'.*pp_size > 1"):
        model.add_adapter_to_model("p", {"r": 2, "target_modules": selector})
    assert "p" not in model.tenants
    model.add_adapter_to_model("q", lora_config({"rank": 4}))  # train_unembed=True
    assert HEAD_KEYS <= set(model.adapter_state_dict(adapter_name="q"))
    model.add_adapter_to_model("r", {"r": 2, "target_modules": r".*(q_proj|lm_head)"})


@pytest.mark.slow
def test_tp2_lm_head_lora_equals_the_transformers_backend(reference, tmp_path):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with ParallelMegatronModel("tiny://qwen3", tp_size=2) as tp2:
        got = train(tp2, tmp_path)
    assert_equivalent(got, reference)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tp", "pp", "microbatches"), [(1, 2, None), (2, 2, 3)], ids=["pp2", "tp2xpp2"]
)
def test_pp_lm_head_lora_equals_the_transformers_backend(reference, tmp_path, tp, pp, microbatches):
    """The head's adapter on the last stage (its untied copy of the embedding frozen), the layers'
    on their stages: losses, post-step adapters and the one saved file equal the transformers
    backend's (tied head); resuming the head tenant's checkpoint gives its next loss back."""
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with ParallelMegatronModel(
        "tiny://qwen3", tp_size=tp, pp_size=pp, num_microbatches=microbatches, launcher="process"
    ) as m:
        got = train(m, tmp_path)
        assert_equivalent(got, reference)
        # Optimizer state across the stages, the head's included, resumes exactly.
        path = m.save(
            "opt", output_dir=str(tmp_path / "opt"), adapter_name="a", save_optimizer=True
        )
        batch = {"a": {"inputs": make_batch(3, 12, 1)}}
        m.clip_grad_and_step_many(["a"], max_grad_norm=0.5)
        after = m.forward_backward_many(batch)["a"]["loss"]
        m.zero_grad(adapter_name="a")
        m.remove_adapter("a")
        m.add_adapter_to_model("a", tenants()["a"][0])
        m.resume_from_checkpoint(path, adapter_name="a")
        m.clip_grad_and_step_many(["a"], max_grad_norm=0.5)
        assert m.forward_backward_many(batch)["a"]["loss"] == pytest.approx(after, rel=1e-5)
