"""Tiny models: deterministic bytes, loadable by transformers, the sizes they promise."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from twinkle.hub import TINY_MODELS, build_tiny_model, load_config, resolve_model_dir

pytestmark = pytest.mark.unit


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_two_builds_are_byte_identical(tmp_path):
    first = build_tiny_model("qwen3.5", tmp_path / "a")
    second = build_tiny_model("qwen3.5", tmp_path / "b")
    files_a, files_b = _files(first), _files(second)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files_a)
    assert files_a.keys() == files_b.keys()
    for name in files_a:
        assert files_a[name] == files_b[name], name


def test_build_in_another_process_is_byte_identical(tmp_path):
    # A fresh interpreter has a different hash seed and thread pool: the bytes must not care.
    here = build_tiny_model("qwen3", tmp_path / "here")
    code = "import sys; from pathlib import Path; from twinkle.hub import build_tiny_model; "
    code += "build_tiny_model('qwen3', Path(sys.argv[1]))"
    env = dict(os.environ, PYTHONHASHSEED="123")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "there")], check=True, env=env)
    assert _files(here) == _files(tmp_path / "there")


@pytest.mark.parametrize(
    ("model_id", "model_type"), [("tiny://qwen3", "qwen3"), ("tiny://qwen3.5", "qwen3_5_text")]
)
def test_forward_gives_logits_over_the_vocab(hub_cache, model_id, model_type):
    model_dir = resolve_model_dir(model_id)
    config = load_config(model_id)
    assert config.model_type == model_type
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert config.tie_word_embeddings
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert next(model.parameters()).dtype == torch.float32
    input_ids_B_T = torch.randint(
        0, config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0)
    )
    logits_B_T_V = model(input_ids=input_ids_B_T).logits
    assert logits_B_T_V.shape == (3, 11, config.vocab_size)
    assert torch.isfinite(logits_B_T_V).all()


def test_qwen3_5_mixes_linear_and_full_attention(hub_cache):
    config = load_config("tiny://qwen3.5")
    assert config.layer_types == ["linear_attention", "full_attention"]


def test_generation_config_uses_chatml_ids(hub_cache):
    model_dir = resolve_model_dir("tiny://qwen3")
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2  # <|im_end|>
    assert generation["pad_token_id"] == 0  # <|endoftext|>


@pytest.mark.parametrize("name", ["qwen3-25m", "qwen3.5-25m"])
def test_benchmark_sizes_have_about_25m_parameters(hub_cache, name):
    start = time.perf_counter()
    model_dir = resolve_model_dir(f"tiny://{name}")
    built_s = time.perf_counter() - start
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n_params:,} parameters, resolved in {built_s:.2f} s")
    assert 20_000_000 <= n_params <= 30_000_000


def test_cache_is_reused_and_keyed_by_spec(hub_cache):
    first = resolve_model_dir("tiny://qwen3")
    start = time.perf_counter()
    assert resolve_model_dir("tiny://qwen3") == first
    assert time.perf_counter() - start < 0.5
    assert first.parent == hub_cache / "tiny"
    assert first.name.startswith("qwen3-") and len(first.name) == len("qwen3-") + 12
    assert resolve_model_dir("tiny/qwen3") == first  # the org/name form servers use


def test_concurrent_processes_build_once(tmp_path):
    code = "from twinkle.hub import resolve_model_dir; print(resolve_model_dir('tiny://qwen3'))"
    env = dict(os.environ, TWINKLE_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outputs) == 1
    leftovers = [p.name for p in (tmp_path / "tiny").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary build directory survives


def test_tiny_models_table():
    assert set(TINY_MODELS) == {
        "qwen3",
        "qwen3.5",
        "qwen3.5-vl",
        "qwen3-25m",
        "qwen3.5-25m",
        "qwen3-0.5b",
        "qwen3-moe",
        "qwen3-vocab",
        "qwen3.5-vocab",
        "qwen3-25m-vocab",
        "qwen3.5-25m-vocab",
        "qwen3.5-4b-shape",
    }
    with pytest.raises(ValueError, match="qwen3.5"):
        build_tiny_model("llama", "/nonexistent")


def test_half_billion_spec_has_the_documented_size():
    """Counted on the meta device: the ~1.8 GB of weights are never built here."""
    import torch
    import transformers

    spec = TINY_MODELS["qwen3-0.5b"]
    config = transformers.Qwen3Config(
        **dict(spec.config), vocab_size=spec.vocab_size, tie_word_embeddings=True
    )
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 444_661_760  # docs/models.md: 444.7 M
