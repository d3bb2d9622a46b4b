"""The mock backend on an image-text model (``Qwen3_5Config`` keeps ``vocab_size`` in its
``text_config``) and on ModelScope Twinkle's ``mock-model`` id (no model behind it)."""

from __future__ import annotations

import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.hub import load_config
from twinkle.model.mock._model import MockModel, model_vocab_size

pytestmark = pytest.mark.unit


def test_an_image_text_config_gives_its_text_models_vocabulary():
    config = load_config("tiny://qwen3.5-vl")
    assert getattr(config, "vocab_size", None) is None  # what made the mock fail to start
    assert model_vocab_size("tiny://qwen3.5-vl") == config.text_config.vocab_size == 4100


def test_a_text_config_and_the_mock_ids():
    assert model_vocab_size("tiny://qwen3") == load_config("tiny://qwen3").vocab_size == 4096
    assert model_vocab_size("mock") == 256
    assert model_vocab_size("mock-model") == 256  # names no model: the mock's default


def test_the_mock_of_an_image_text_model_trains_on_its_image_token_ids():
    model = MockModel.for_model("tiny://qwen3.5-vl")
    assert (model.model_id, model.vocab_size) == ("tiny://qwen3.5-vl", 4100)
    model.add_adapter_to_model("a", {"r": 4, "lora_alpha": 8})
    image_pad = load_config("tiny://qwen3.5-vl").image_token_id
    assert image_pad >= 4096  # beyond the text tokenizer's ids, inside the model's vocabulary
    rows = [{"input_ids": [1, image_pad, image_pad, 7, 8], "labels": [-100, -100, -100, 7, 8]}]
    result = model.forward_backward(rows)
    assert result["loss"] > 0 and len(result["logprobs"][0]) == 5
    with pytest.raises(InvalidArgumentError, match=r"\[0, 4100\)"):
        model.forward_backward([{"input_ids": [1, 4100], "labels": [1, 4100]}])


@pytest.mark.parametrize(("model_id", "vocab"), [("tiny://qwen3.5-vl", 4100), ("mock-model", 256)])
def test_the_mock_backend_and_sampler_start_on_it(model_id, vocab):
    from twinkle.sampler.mock_sampler import _vocab_size
    from twinkle.server.model.backend import create_backend

    model = create_backend("mock", model_id)
    assert (model.model_id, model.vocab_size) == (model_id, vocab)
    assert _vocab_size(model_id) == vocab
