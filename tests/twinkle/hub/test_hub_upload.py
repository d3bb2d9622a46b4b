"""twinkle.hub.upload against the loopback ModelScope stand-in: modelscope's real HubApi code path,
no network. What arrives at the hub is asserted: token, repository, files byte for byte."""

from __future__ import annotations

import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twinkle.errors import InvalidArgumentError, PathNotFoundError  # noqa: E402
from twinkle.hub.upload import (  # noqa: E402
    UPLOADED_FILES,
    HubUpload,
    HubUploadError,
    hub_username,
    upload_to_hub,
)

ADAPTER = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": bytes(range(256)) * 9}


def checkpoint(root: Path, readme: bool = False) -> Path:
    """A checkpoint directory as ``save(save_optimizer=True)`` leaves it."""
    directory = root / "ck"
    directory.mkdir()
    for name, data in ADAPTER.items():
        (directory / name).write_bytes(data)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pt", "trainer_state.json"):
        (directory / name).write_bytes(b"training state")
    if readme:
        (directory / "README.md").write_text("# my adapter\n")
    return directory


def test_only_the_adapter_files_arrive_byte_for_byte_with_the_token(standin_hub, tmp_path):
    directory = checkpoint(tmp_path, readme=True)
    result = upload_to_hub(directory, "alice/my-adapter", token="ms-alice")
    expected = {**ADAPTER, "README.md": b"# my adapter\n"}
    assert isinstance(result, HubUpload) and set(result.files) == set(expected)
    assert result.url == f"{standin_hub.url}/models/alice/my-adapter"
    assert standin_hub.files["alice/my-adapter"] == expected
    assert standin_hub.repos["alice/my-adapter"] == 1  # created private
    assert standin_hub.tokens_used() == {"ms-alice"}
    assert sorted(os_names(directory)) == sorted([*expected, "optimizer.pt", "rng_state.pt",
                                                   "scheduler.pt", "trainer_state.json"])  # fmt: skip


def os_names(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir()]  # nothing (no upload cache) written into it


def test_async_upload_returns_a_future_and_the_env_token_is_the_default(
    standin_hub, tmp_path, monkeypatch
):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-bob")
    directory = checkpoint(tmp_path)
    future = upload_to_hub(directory, "bob/async", async_upload=True, private=False)
    assert isinstance(future, Future)
    result = future.result(timeout=60)
    assert result.files == ("adapter_config.json", "adapter_model.safetensors")
    assert standin_hub.files["bob/async"] == ADAPTER and standin_hub.repos["bob/async"] == 5
    assert standin_hub.tokens_used() == {"ms-bob"}


def test_an_existing_repository_is_updated(standin_hub, tmp_path):
    directory = checkpoint(tmp_path)
    upload_to_hub(directory, "alice/again", token="ms-alice")
    (directory / "adapter_model.safetensors").write_bytes(b"newer weights")
    upload_to_hub(directory, "alice/again", token="ms-alice")
    assert standin_hub.files["alice/again"]["adapter_model.safetensors"] == b"newer weights"


def test_a_rejected_token_is_a_clear_error(standin_hub, tmp_path):
    directory = checkpoint(tmp_path)
    with pytest.raises(HubUploadError, match="refused.*'bob/x'.*token"):
        upload_to_hub(directory, "bob/x", token="ms-alice")  # alice may not write bob's
    with pytest.raises(HubUploadError, match="refused"):
        upload_to_hub(directory, "alice/x", token="ms-nobody")
    async_failure = upload_to_hub(directory, "alice/x", token="ms-nobody", async_upload=True)
    with pytest.raises(HubUploadError, match="refused"):
        async_failure.result(timeout=60)
    assert standin_hub.files == {}


def test_mistakes_fail_before_anything_is_sent(standin_hub, tmp_path):
    directory = checkpoint(tmp_path)
    with pytest.raises(HubUploadError, match="MODELSCOPE_API_TOKEN"):
        upload_to_hub(directory, "alice/x")
    with pytest.raises(InvalidArgumentError, match="owner/name"):
        upload_to_hub(directory, "../x", token="ms-alice")
    with pytest.raises(PathNotFoundError, match="adapter_model.safetensors missing"):
        (directory / "adapter_model.safetensors").unlink()
        upload_to_hub(directory, "alice/x", token="ms-alice")
    with pytest.raises(PathNotFoundError, match="does not exist"):
        upload_to_hub(tmp_path / "nope", "alice/x", token="ms-alice")
    assert standin_hub.requests == []


def test_missing_modelscope_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "modelscope.hub.api", None)
    with pytest.raises(HubUploadError, match="pip install modelscope"):
        upload_to_hub(checkpoint(tmp_path), "alice/x", token="ms-alice")


def test_hub_username_tells_a_token_from_another_key(standin_hub):
    assert hub_username("ms-alice") == "alice"
    assert hub_username("key-alice-123") is None


def test_the_local_model_uploads_what_save_wrote(standin_hub, tmp_path, monkeypatch):
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("tiny://qwen3")
    model.add_adapter_to_model("t", LoraConfig(r=4, lora_alpha=8))
    model.set_optimizer("AdamW", lr=1e-3)
    path = model.save("ck", output_dir=tmp_path, save_optimizer=True)
    result = model.upload_to_hub(checkpoint_dir=path, hub_model_id="alice/tiny", token="ms-alice")
    assert set(result.files) == set(UPLOADED_FILES) - {"README.md"}
    sent = standin_hub.files["alice/tiny"]
    assert sent == {name: (Path(path) / name).read_bytes() for name in result.files}
    # A bare name is the checkpoint under the adapter's default output directory.
    monkeypatch.setenv("TWINKLE_OUTPUT_DIR", str(tmp_path / "out"))
    model.save("by-name")
    future = model.upload_to_hub("by-name", "alice/by-name", async_upload=True, token="ms-alice")
    assert future.result(timeout=60).hub_model_id == "alice/by-name"
    with pytest.raises(InvalidArgumentError, match="invalid checkpoint name"):
        model.upload_to_hub("not a name", "alice/x", token="ms-alice")
    with pytest.raises(PathNotFoundError, match="does not exist"):
        model.upload_to_hub("never-saved", "alice/x", token="ms-alice")
