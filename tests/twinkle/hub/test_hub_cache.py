"""ms:// and hf:// ids resolve offline from the hubs' own caches, seeded under real repo names."""

import socket

import pytest

from twinkle.hub import (
    load_tokenizer,
    resolve_model_dir,
    seed_huggingface_cache,
    seed_modelscope_cache,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket fails the test: the caches must answer on their own."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "MODELSCOPE_OFFLINE",
        "HF_DATASETS_OFFLINE",
    ):
        monkeypatch.setenv(name, "1")


@pytest.fixture
def caches(monkeypatch, tmp_path, hub_cache):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path


def test_tiny_model_under_the_seeds_name_loads_from_the_modelscope_cache(caches, no_network):
    tiny = resolve_model_dir("tiny://qwen3.5")
    seeded = seed_modelscope_cache("Qwen/Qwen3.5-4B", tiny)
    # modelscope's own layout: models/<org>--<name>/snapshots/master
    assert seeded == caches / "modelscope" / "models" / "Qwen--Qwen3.5-4B" / "snapshots" / "master"
    assert resolve_model_dir("ms://Qwen/Qwen3.5-4B") == seeded
    assert resolve_model_dir("Qwen/Qwen3.5-4B") == seeded  # a bare org/name means ModelScope
    tokenizer = load_tokenizer("ms://Qwen/Qwen3.5-4B")
    assert tokenizer.encode("hello") == load_tokenizer("tiny://qwen3.5").encode("hello")

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir("ms://Qwen/Qwen3.5-4B"))
    assert type(model).__name__ == "Qwen3_5ForCausalLM"


def test_tiny_model_loads_from_the_huggingface_cache(caches, no_network):
    seeded = seed_huggingface_cache("Qwen/Qwen3.5-4B", resolve_model_dir("tiny://qwen3.5"))
    assert seeded.parent.parent.name == "models--Qwen--Qwen3.5-4B"
    assert resolve_model_dir("hf://Qwen/Qwen3.5-4B") == seeded


def test_legacy_modelscope_layout_is_still_found(caches, no_network):
    legacy = caches / "modelscope" / "models" / "Qwen" / "Qwen3___5-4B"
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    assert resolve_model_dir("ms://Qwen/Qwen3.5-4B") == legacy


def test_dataset_from_the_modelscope_cache_with_the_seeds_arguments(caches, no_network, tmp_path):
    from twinkle.dataset import Dataset, DatasetMeta

    rows = tmp_path / "rows"
    rows.mkdir()
    lines = [f'{{"query": "q{i}", "response": "r{i}"}}' for i in range(700)]
    (rows / "self_cognition.jsonl").write_text("\n".join(lines) + "\n")
    seed_modelscope_cache("swift/self-cognition", rows, repo_type="dataset")
    dataset = Dataset(dataset_meta=DatasetMeta("ms://swift/self-cognition", data_slice=range(500)))
    assert len(dataset) == 500
    assert dataset[0]["query"] == "q0" and dataset[499]["response"] == "r499"


def test_dataset_from_the_huggingface_cache(caches, no_network, tmp_path):
    from twinkle.dataset import Dataset, DatasetMeta

    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    seed_huggingface_cache("someone/tiny-text", rows, repo_type="dataset")
    dataset = Dataset(dataset_meta=DatasetMeta("hf://someone/tiny-text"))
    assert [dataset[i]["text"] for i in range(len(dataset))] == ["a", "b"]


def test_uncached_dataset_offline_fails_fast_naming_the_cache(caches, no_network):
    from twinkle.dataset import Dataset, DatasetMeta

    with pytest.raises(FileNotFoundError, match="swift/self-cognition.*ModelScope cache"):
        Dataset(dataset_meta=DatasetMeta("ms://swift/self-cognition"))


def test_seed_command_line(caches, no_network, capsys):
    from twinkle.hub.__main__ import main

    assert main(["seed", "ms://Qwen/Qwen3.5-4B", "--from", "tiny://qwen3.5"]) == 0
    assert main(["seed", "ms://swift/self-cognition", "--dataset",
                 "--from", "builtin://self-cognition"]) == 0  # fmt: skip
    assert "seeded ms://swift/self-cognition (dataset)" in capsys.readouterr().out
    assert (resolve_model_dir("ms://Qwen/Qwen3.5-4B") / "config.json").is_file()
