"""Model ids: schemes, local directories, and failing fast when offline."""

import time

import pytest

import twinkle.hub
from twinkle.hub import ModelNotFoundError, resolve_model_dir

pytestmark = pytest.mark.unit


def test_public_surface():
    assert sorted(twinkle.hub.__all__) == sorted(
        [
            "ModelNotFoundError",
            "RemoteCodeRefusedError",
            "TINY_MODELS",
            "build_tiny_model",
            "load_config",
            "load_tokenizer",
            "remote_code_guard",
            "resolve_model_dir",
            "seed_huggingface_cache",
            "seed_modelscope_cache",
            "trust_remote_code",
        ]
    )
    assert issubclass(ModelNotFoundError, FileNotFoundError)


@pytest.mark.parametrize(
    "model_id", ["ms://nobody-here/no-such-model", "hf://nobody-here/no-such-model"]
)
@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "TWINKLE_OFFLINE"])
def test_offline_and_not_cached_fails_fast(monkeypatch, tmp_path, model_id, flag):
    for name in ("HF_HUB_OFFLINE", "TWINKLE_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(flag, "1")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="nobody-here/no-such-model") as info:
        resolve_model_dir(model_id)
    assert time.perf_counter() - start < 2
    assert "tiny://qwen3.5" in str(info.value)  # the message says how to get going offline


def test_modelscope_cache_is_found(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path))
    model_dir = tmp_path / "models" / "Qwen" / "Qwen3___5-4B"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    assert resolve_model_dir("ms://Qwen/Qwen3.5-4B") == model_dir
    assert resolve_model_dir("Qwen/Qwen3.5-4B") == model_dir  # bare org/name means ModelScope


def test_local_directory_is_returned_as_is(tmp_path):
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    assert resolve_model_dir(tmp_path) == tmp_path


def test_missing_local_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does-not-exist"):
        resolve_model_dir(str(tmp_path / "does-not-exist"))


@pytest.mark.parametrize("model_id", ["tiny://llama", "tiny/gpt2"])
def test_unknown_tiny_name_lists_choices(model_id):
    with pytest.raises(ValueError, match=r"tiny://qwen3\.5"):
        resolve_model_dir(model_id)


def test_unknown_scheme_lists_choices():
    with pytest.raises(ValueError, match="ms://"):
        resolve_model_dir("s3://bucket/model")
