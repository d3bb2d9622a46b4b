"""ExecutionOptions: one object for every execution knob, environment defaults read once."""

from __future__ import annotations

import pytest
from peft import LoraConfig

from twinkle.model import MultiLoraTransformersModel
from twinkle.model.options import ExecutionOptions, resolve_options

pytestmark = pytest.mark.unit


def test_environment_supplies_defaults_and_overrides_win():
    env = {"TWINKLE_LORA_KERNEL": "torch", "TWINKLE_MALLOC_TUNING": "0"}
    options = ExecutionOptions.from_env(env)
    assert options.lora_kernel == "torch" and options.malloc_tuning is False
    assert ExecutionOptions.from_env(env, lora_kernel="auto").lora_kernel == "auto"
    assert ExecutionOptions.from_env({}) == ExecutionOptions()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lora_kernel", "cuda", "lora_kernel must be one of"),
        ("small_tensor_elements", 0, "small_tensor_elements must be a positive integer"),
        ("logprob_chunk_bytes", True, "logprob_chunk_bytes must be a positive integer"),
        ("cpu_threads", 0, "cpu_threads must be an integer >= 1"),
    ],
)
def test_bad_values_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        ExecutionOptions(**{field: value})


def test_resolve_options_takes_an_object_a_mapping_or_nothing():
    given = ExecutionOptions(fused_adam=False)
    assert resolve_options(given) is given
    assert resolve_options({"fused_adam": False}) == given
    with pytest.raises(ValueError, match="unknown execution option"):
        resolve_options({"fused_adm": False})
    with pytest.raises(TypeError):
        resolve_options(3)


def test_a_model_uses_its_options_and_nothing_global():
    plain = MultiLoraTransformersModel("tiny://qwen3")
    tuned = MultiLoraTransformersModel(
        "tiny://qwen3",
        options=ExecutionOptions(lora_kernel="torch", direct_weight_grads=False, fused_adam=False),
    )
    assert plain.router.kernel == "auto" and tuned.router.kernel == "torch"
    assert plain.direct_weight_grads and not tuned.direct_weight_grads
    for model in (plain, tuned):
        model.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=8))
        model.set_optimizer("AdamW", adapter_name="a", lr=1e-3)
    assert plain.tenant("a").optimizer.param_groups[0]["fused"] is True
    assert not tuned.tenant("a").optimizer.param_groups[0]["fused"]
