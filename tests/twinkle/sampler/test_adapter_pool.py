"""Adapter loading: LRU eviction, allowed directories, and clean errors that change nothing."""

import json
import os
import shutil

import pytest
from peft import LoraConfig

from tests.twinkle.sampler.conftest import prompts
from twinkle.model import MultiLoraTransformersModel
from twinkle.sampler import TorchSampler


@pytest.fixture(scope="module")
def env(qwen35, tmp_path_factory):
    model_id, trainer, paths = qwen35
    root = paths[0].rsplit("/", 1)[0]
    sampler = TorchSampler(model_id, max_loras=2, allowed_adapter_dirs=[root])
    return sampler, paths, root, tmp_path_factory.mktemp("outside")


def _pool_state(sampler):
    layer = next(m for m in sampler.model.modules() if hasattr(m, "lora_A"))
    return sampler.adapters.loaded(), sorted(layer.lora_A.keys())


def test_lru_evicts_least_recently_used(env):
    sampler, paths, _, _ = env
    sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=paths[0])
    sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=paths[1])
    sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=paths[0])  # touch 0: 1 is now LRU
    sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=paths[2])
    loaded, names = _pool_state(sampler)
    assert [os.path.realpath(p) for p in (paths[0], paths[2])] == loaded
    assert len(names) == 2


def test_too_many_adapters_in_one_call(env):
    sampler, paths, _, _ = env
    before = _pool_state(sampler)
    with pytest.raises(ValueError, match="max_loras"):
        sampler.sample(prompts(3), {"max_tokens": 1}, adapter_uri=paths)
    assert _pool_state(sampler) == before


def test_missing_adapter(env):
    sampler, paths, root, _ = env
    before = _pool_state(sampler)
    with pytest.raises(FileNotFoundError, match="adapter"):
        sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=os.path.join(root, "nope"))
    assert _pool_state(sampler) == before


def test_outside_allowed_dirs_even_through_dotdot_and_symlink(env):
    sampler, paths, root, outside = env
    copy = outside / "copy"
    shutil.copytree(paths[0], copy)
    link = os.path.join(root, "link-out")
    if not os.path.exists(link):
        os.symlink(copy, link)
    before = _pool_state(sampler)
    for uri in (str(copy), os.path.join(root, "..", outside.name, "copy"), link):
        with pytest.raises(PermissionError, match="outside the allowed"):
            sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=uri)
    assert _pool_state(sampler) == before


def test_adapter_of_another_base_model(env, tmp_path):
    sampler, _, root, _ = env
    other = MultiLoraTransformersModel("tiny://qwen3")
    other.add_adapter_to_model("x", LoraConfig(r=4, lora_alpha=8))
    path = other.save("other", output_dir=os.path.join(root, "other-base"))
    before = _pool_state(sampler)
    with pytest.raises(ValueError, match="base model"):
        sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=path)
    # Same weights, but the config hides the base: the shapes/keys still do not fit.
    config_path = os.path.join(path, "adapter_config.json")
    config = json.load(open(config_path))
    config.pop("base_model_name_or_path")
    json.dump(config, open(config_path, "w"))
    with pytest.raises(ValueError, match="does not fit"):
        sampler.sample(prompts(1), {"max_tokens": 1}, adapter_uri=path)
    assert _pool_state(sampler) == before


def test_adapter_name_alias(env):
    sampler, paths, _, _ = env
    sampler.load_adapter(paths[0], adapter_name="tenant-c")
    by_name = sampler.sample(prompts(1), {"max_tokens": 3, "seed": 1}, adapter_name="tenant-c")
    by_uri = sampler.sample(prompts(1), {"max_tokens": 3, "seed": 1}, adapter_uri=paths[0])
    assert by_name[0].sequences[0].tokens == by_uri[0].sequences[0].tokens
    with pytest.raises(ValueError, match="unknown adapter_name"):
        sampler.sample(prompts(1), {"max_tokens": 1}, adapter_name="nobody")
