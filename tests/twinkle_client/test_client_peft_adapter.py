"""A PEFT adapter directory (``save_pretrained`` on the tiny base) continues training through
twinkle_client: ``load(local_dir)`` uploads its two files; the server's adapter then computes what
peft computes, trains, and keeps the files as the tenant's checkpoint. Every refused upload is a
400 naming what differs, and the tenant's adapter and checkpoints stay as they were."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from serving import KEYS, MODEL_ID
from transformers import AutoModelForCausalLM

from twinkle.hub import resolve_model_dir
from twinkle_client import init_twinkle_client
from twinkle_client.errors import BadRequestError, NotFoundError
from twinkle_client.model import MultiLoraTransformersModel

IDS = list(range(10, 22))
FEATURES = [{"input_ids": IDS, "labels": [-100] * 3 + IDS[3:]}]
ADAPTER = "cont"


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory):
    """A directory peft's ``save_pretrained`` wrote (per-layer ranks included), and its model."""
    config = LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "gate_proj"],
        rank_pattern={"gate_proj": 8},
        init_lora_weights=False,  # B is not zero: the adapter changes the logits
    )
    base = AutoModelForCausalLM.from_pretrained(resolve_model_dir(MODEL_ID), dtype=torch.float32)
    torch.manual_seed(5)
    peft_model = get_peft_model(base, config).eval()
    directory = tmp_path_factory.mktemp("peft") / "my-adapter"
    peft_model.save_pretrained(directory)
    assert (directory / "README.md").exists()  # peft's model card: not uploaded
    return directory, peft_model


@pytest.fixture(scope="module")
def alice(live):
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def uploaded(alice, peft_dir):
    """Alice's adapter created from the directory's config, its weights uploaded."""
    directory, _ = peft_dir
    model = MultiLoraTransformersModel(model_id=MODEL_ID, client=alice)
    model.add_adapter_to_model(ADAPTER, LoraConfig.from_pretrained(directory))
    model.load(directory, adapter_name=ADAPTER)
    yield model
    model.remove_adapter(ADAPTER)


def _server_dir(live, who: str, path: str) -> Path:
    owner = live[1].context.authenticate({"x-api-key": KEYS[who]})
    return Path(live[1].context.state.resolve_checkpoint_path(owner, path).local_dir)


def _peft_logprobs(peft_model) -> torch.Tensor:
    """peft's log-probs of the trained targets (each token predicted from the ones before)."""
    ids = torch.tensor([IDS])
    with torch.no_grad():
        logits = peft_model(input_ids=ids).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    labels = torch.tensor(FEATURES[0]["labels"][1:])
    return logprobs[labels != -100]


def _logprobs(model) -> torch.Tensor:
    return torch.tensor(model.forward_only(inputs=FEATURES, adapter_name=ADAPTER)["logprobs"][0])


def _checkpoints(model) -> list[str]:
    return sorted(c.checkpoint_id for c in model.client.list_checkpoints(model.training_run_id))


def test_the_uploaded_adapter_computes_what_peft_computes(uploaded, peft_dir, live):
    directory, peft_model = peft_dir
    torch.testing.assert_close(_logprobs(uploaded), _peft_logprobs(peft_model), rtol=0, atol=1e-5)
    saved = load_file(str(directory / "adapter_model.safetensors"))
    back = load_file(
        str(_server_dir(live, "alice", uploaded.save("read-back")) / "adapter_model.safetensors")
    )
    assert set(back) == set(saved) and all(torch.equal(back[k], saved[k]) for k in saved)


def test_the_upload_is_a_checkpoint_of_the_tenant_with_the_two_files_only(uploaded, peft_dir, live):
    directory, _ = peft_dir
    path = f"twinkle://{uploaded.training_run_id}/weights/{directory.name}"
    assert any(c.endswith(directory.name) for c in _checkpoints(uploaded))
    stored = _server_dir(live, "alice", path)
    assert sorted(p.name for p in stored.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (stored / name).read_bytes() == (directory / name).read_bytes()
    uploaded.load(path, adapter_name=ADAPTER)  # a twinkle:// path loads on the server


def test_the_uploaded_adapter_trains(uploaded):
    before = _logprobs(uploaded)
    uploaded.set_optimizer("Adam", lr=1e-2, adapter_name=ADAPTER)
    out = uploaded.forward_backward(inputs=FEATURES, adapter_name=ADAPTER)
    assert out["loss"] > 0
    assert uploaded.clip_grad_and_step(adapter_name=ADAPTER) is True
    assert not torch.equal(_logprobs(uploaded), before)


# ---------------------------------------------------------------------------- refusals
def _copy(directory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "adapter"
    shutil.copytree(directory, target)
    return target


def _edit_config(directory: Path, **fields) -> None:
    path = directory / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _wrong_rank(directory: Path) -> None:
    path = directory / "adapter_model.safetensors"
    state = load_file(str(path))
    key = next(k for k in sorted(state) if "q_proj.lora_A" in k)
    state[key] = state[key][:2].contiguous()
    save_file(state, str(path))


def _drop_a_tensor(directory: Path) -> None:
    path = directory / "adapter_model.safetensors"
    state = load_file(str(path))
    state.pop(next(k for k in sorted(state) if "v_proj.lora_B" in k))
    save_file(state, str(path))


CORRUPTIONS = {
    "wrong rank": (_wrong_rank, r"q_proj\.lora_A\.weight has shape \(2, "),
    "missing tensor": (
        _drop_a_tensor,
        r"missing \['base_model\.model\.model\.layers\.0\.self_attn\.v_proj",
    ),
    "use_dora": (lambda d: _edit_config(d, use_dora=True), "use_dora=True is refused"),
    "unknown field": (lambda d: _edit_config(d, lora_wizardry=3), "lora_wizardry=3 is refused"),
    "other alpha": (lambda d: _edit_config(d, lora_alpha=8), r"lora_alpha=8.*lora_alpha=16"),
    "other base": (
        lambda d: _edit_config(d, base_model_name_or_path="Qwen/Qwen2.5-7B"),
        "base_model_name_or_path='Qwen/Qwen2.5-7B' is not this server's base model",
    ),
    "not a lora": (lambda d: _edit_config(d, peft_type="IA3"), "only LORA adapters"),
    "bad json": (
        lambda d: (d / "adapter_config.json").write_text("{r: 4"),
        "adapter_config.json: not valid JSON",
    ),
    "bad safetensors": (
        lambda d: (d / "adapter_model.safetensors").write_bytes(b"\x10\x00not safetensors"),
        "adapter_model.safetensors: not a safetensors file",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_mismatched_upload_is_refused_and_changes_nothing(case, uploaded, peft_dir, tmp_path):
    corrupt, message = CORRUPTIONS[case]
    directory = _copy(peft_dir[0], tmp_path)
    corrupt(directory)
    before, checkpoints = _logprobs(uploaded), _checkpoints(uploaded)
    with pytest.raises(BadRequestError, match=message):
        uploaded.load(directory, adapter_name=ADAPTER, name=f"refused-{case.replace(' ', '-')}")
    assert torch.equal(_logprobs(uploaded), before)
    assert _checkpoints(uploaded) == checkpoints


def _raw_upload(model, files: dict[str, bytes], name: str = "raw") -> None:
    encoded = {k: base64.b64encode(v).decode() for k, v in files.items()}
    model.client.call(
        model.route, "upload_adapter", {"adapter_name": ADAPTER, "name": name, "files": encoded}
    )


def _files(directory: Path) -> dict[str, bytes]:
    return {
        n: (directory / n).read_bytes()
        for n in ("adapter_config.json", "adapter_model.safetensors")
    }


def test_an_extra_or_missing_file_is_refused(uploaded, peft_dir):
    files = _files(peft_dir[0])
    before, checkpoints = _logprobs(uploaded), _checkpoints(uploaded)
    with pytest.raises(BadRequestError, match="'optimizer.pt' refused: an upload carries only"):
        _raw_upload(uploaded, {**files, "optimizer.pt": b"pickle"})
    with pytest.raises(BadRequestError, match="'../x' refused"):
        _raw_upload(uploaded, {**files, "../x": b""})
    with pytest.raises(BadRequestError, match="adapter_model.safetensors missing"):
        _raw_upload(uploaded, {"adapter_config.json": files["adapter_config.json"]})
    assert torch.equal(_logprobs(uploaded), before) and _checkpoints(uploaded) == checkpoints


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "/etc/passwd", "x" * 200])
def test_a_path_trick_name_is_refused(name, uploaded, peft_dir):
    before, checkpoints = _logprobs(uploaded), _checkpoints(uploaded)
    with pytest.raises(BadRequestError, match="checkpoint name"):
        uploaded.load(peft_dir[0], adapter_name=ADAPTER, name=name)
    assert torch.equal(_logprobs(uploaded), before) and _checkpoints(uploaded) == checkpoints


def test_another_tenant_loads_only_into_its_own_adapter(uploaded, peft_dir, live):
    bob = init_twinkle_client(base_url=live[0], api_key=KEYS["bob"], timeout=120)
    before = _logprobs(uploaded)
    try:
        theirs = MultiLoraTransformersModel(model_id=MODEL_ID, client=bob)
        with pytest.raises(NotFoundError, match="unknown adapter 'cont'"):
            theirs.load(peft_dir[0], adapter_name=ADAPTER)  # names are per key: bob has none
        alices = f"twinkle://{uploaded.training_run_id}/weights/{peft_dir[0].name}"
        theirs.add_adapter_to_model(ADAPTER, peft_dir[0])  # the directory's adapter_config.json
        with pytest.raises(NotFoundError, match="not found"):
            theirs.load(alices, adapter_name=ADAPTER)
        theirs.load(peft_dir[0], adapter_name=ADAPTER)  # into bob's own adapter
        torch.testing.assert_close(
            _logprobs(theirs), _peft_logprobs(peft_dir[1]), rtol=0, atol=1e-5
        )
        theirs.remove_adapter(ADAPTER)
    finally:
        bob.close()
    assert torch.equal(_logprobs(uploaded), before)


def test_a_local_path_that_is_not_an_adapter_directory_sends_nothing(uploaded, tmp_path):
    with pytest.raises(FileNotFoundError, match="twinkle:// path"):
        uploaded.load(tmp_path / "missing", adapter_name=ADAPTER)
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        uploaded.load(tmp_path, adapter_name=ADAPTER)
