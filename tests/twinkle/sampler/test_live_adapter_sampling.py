"""``Sampler.load_adapter_from_model``: sampling from the live training adapter, no checkpoint.

The in-memory path must sample exactly what a checkpoint of the same weights samples, see each
new step, and refuse a state that does not fit without changing what it held.
"""

import pytest
import torch
from peft import LoraConfig

from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.sampler import MockSampler, TorchSampler

MODEL_ID = "tiny://qwen3"
PROMPTS = [[11, 22, 33, 44], [55, 66, 77]]
GREEDY = {"max_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def trainer():
    model = MultiLoraTransformersModel(MODEL_ID)
    model.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=32, init_lora_weights=False), seed=3)
    model.add_adapter_to_model("b", LoraConfig(r=4, lora_alpha=8, init_lora_weights=False), seed=4)
    for name in ("a", "b"):
        model.set_optimizer("AdamW", lr=5e-2, adapter_name=name)
    return model


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    return TorchSampler(MODEL_ID, allowed_adapter_dirs=[tmp_path_factory.getbasetemp()])


def _step(model, name: str) -> None:
    ids = torch.arange(10, 26).tolist()
    model.forward_backward([{"input_ids": ids, "labels": ids}], adapter_name=name)
    model.clip_grad_and_step(adapter_name=name)


def _sample(sampler, **adapter):
    out = sampler.sample(PROMPTS, GREEDY, **adapter)
    return [(s.tokens, s.logprobs) for r in out for s in r.sequences]


def _assert_same(x, y):
    assert [t for t, _ in x] == [t for t, _ in y]
    for (_, lx), (_, ly) in zip(x, y):
        assert torch.allclose(torch.tensor(lx), torch.tensor(ly), atol=1e-6, rtol=0)


def test_in_memory_equals_checkpoint_and_sees_each_step(trainer, sampler, tmp_path):
    _step(trainer, "a")
    uri = sampler.load_adapter_from_model(trainer, "a")
    assert uri == "inflight://a"
    live = _sample(sampler, adapter_uri=uri)
    path = trainer.save("s1", output_dir=tmp_path, save_optimizer=False, adapter_name="a")
    _assert_same(live, _sample(sampler, adapter_uri=path))
    _assert_same(live, _sample(sampler, adapter_name="a"))
    assert live != _sample(sampler)  # the adapter changes the samples

    _step(trainer, "a")
    assert _sample(sampler, adapter_uri=uri) == live  # a copy: training does not reach it
    assert sampler.load_adapter_from_model(trainer, "a") == uri
    second = _sample(sampler, adapter_uri=uri)
    path2 = trainer.save("s2", output_dir=tmp_path, save_optimizer=False, adapter_name="a")
    _assert_same(second, _sample(sampler, adapter_uri=path2))
    assert [lp for _, lp in second] != [lp for _, lp in live]


def test_adapters_stay_apart_and_another_config_replaces(trainer, sampler, tmp_path):
    ua = sampler.load_adapter_from_model(trainer, "a")
    ub = sampler.load_adapter_from_model(trainer, "b")
    pa = trainer.save("pa", output_dir=tmp_path, save_optimizer=False, adapter_name="a")
    pb = trainer.save("pb", output_dir=tmp_path, save_optimizer=False, adapter_name="b")
    out = sampler.sample([PROMPTS[0], PROMPTS[0]], GREEDY, adapter_uri=[ua, ub])
    ref = sampler.sample([PROMPTS[0], PROMPTS[0]], GREEDY, adapter_uri=[pa, pb])
    assert [r.sequences[0].tokens for r in out] == [r.sequences[0].tokens for r in ref]
    for r, q in zip(out, ref):
        assert torch.allclose(
            torch.tensor(r.sequences[0].logprobs), torch.tensor(q.sequences[0].logprobs), atol=1e-6
        )


def test_a_state_that_does_not_fit_changes_nothing(trainer, sampler):
    uri = sampler.load_adapter_from_model(trainer, "a")
    before = _sample(sampler, adapter_uri=uri)
    config = trainer.adapter_peft_config("a")
    state = trainer.adapter_state_dict("a")
    key = next(iter(state))
    bad = {**state, key: torch.zeros(3, 3)}
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        sampler.adapters.put_state(uri, config, bad)
    missing = dict(state)
    missing.pop(key)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        sampler.adapters.put_state(uri, config, missing)
    assert _sample(sampler, adapter_uri=uri) == before


def test_unknown_live_adapter_and_unsupported_sides(trainer, sampler):
    with pytest.raises(FileNotFoundError, match="no live adapter"):
        sampler.sample(PROMPTS, GREEDY, adapter_uri="inflight://never-published")
    with pytest.raises(InvalidArgumentError, match="model: object"):
        sampler.load_adapter_from_model(object(), "a")
    with pytest.raises(InvalidArgumentError, match="cannot load adapters from memory"):
        MockSampler().load_adapter_from_model(trainer, "a")
