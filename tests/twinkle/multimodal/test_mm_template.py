"""Templates, encode and collation with images (tiny://qwen3.5-vl's processor and tokenizer)."""

import io

import numpy as np
import pytest

from tests.twinkle.multimodal.conftest import (
    VL_MODEL,
    image_trajectories,
    text_trajectories,
    two_image_trajectory,
)
from twinkle.data_format import IGNORE_INDEX
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.dataset._self_cognition_vl import draw
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor
from twinkle.template import Qwen3_5Template, _vision


def _chat_dicts(trajectory):
    """The trajectory as plain dicts for a Jinja chat template."""
    out = []
    for m in trajectory["messages"]:
        content = m["content"]
        if not isinstance(content, str):
            content = [{"type": p["type"], "text": p.get("text")} for p in content]
        out.append({"role": m["role"], "content": content})
    return out


def test_render_matches_the_models_chat_template(vl_template):
    for trajectory in [*image_trajectories(2), two_image_trajectory(), *text_trajectories(1)]:
        expected = vl_template.tokenizer.apply_chat_template(
            _chat_dicts(trajectory), tokenize=False
        )
        assert vl_template.render(trajectory) == expected


def test_encode_expands_each_image_and_adds_pixels(vl_template):
    feature = vl_template.encode(two_image_trajectory())
    grid = feature["image_grid_thw"]
    # 32 px and 48 px pictures at 8 px patches: 4x4 and 6x6 patch grids, one frame each.
    assert grid.tolist() == [[1, 4, 4], [1, 6, 6]]
    assert feature["pixel_values"].shape == (16 + 36, 3 * 2 * 8 * 8)
    vocab = vl_template.tokenizer.get_vocab()
    ids = feature["input_ids"].tolist()
    assert ids.count(vocab[_vision.IMAGE_PAD]) == (16 + 36) // 4
    assert ids.count(vocab[_vision.VISION_START]) == 2
    # No loss on any vision token, nor on the user turn; the answer is trained.
    vision_ids = {vocab[t] for t in _vision.VISION_TOKENS}
    labels = feature["labels"]
    assert all(labels[i] == IGNORE_INDEX for i, t in enumerate(ids) if t in vision_ids)
    answer = vl_template.decode([t for t in labels.tolist() if t != IGNORE_INDEX])
    assert answer == "A red circle and a blue square.<|im_end|>"


def test_text_samples_encode_as_on_the_text_model(vl_template):
    text = Qwen3_5Template(model_id="tiny://qwen3.5")
    for trajectory in text_trajectories(3):
        a, b = vl_template.encode(trajectory), text.encode(trajectory)
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["labels"].tolist() == b["labels"].tolist()
        assert "pixel_values" not in a


def test_text_model_refuses_images():
    with pytest.raises(ValueError, match="no image processor"):
        Qwen3_5Template(model_id="tiny://qwen3.5").encode(image_trajectories(1)[0])


def test_corrupt_and_oversized_images_are_refused(vl_template, monkeypatch):
    bad = image_trajectories(1)[0]
    bad["messages"][0]["content"][0] = {"type": "image", "image": b"\x89PNG not really"}
    with pytest.raises(ValueError, match="not a readable image"):
        vl_template.encode(bad)
    truncated = io.BytesIO()
    draw("circle", "red").save(truncated, format="PNG")
    bad["messages"][0]["content"][0] = {"type": "image", "image": truncated.getvalue()[:60]}
    with pytest.raises(ValueError, match="image"):
        vl_template.encode(bad)
    monkeypatch.setattr(_vision, "MAX_IMAGE_PIXELS", 31 * 31)
    with pytest.raises(ValueError, match="MAX_IMAGE_PIXELS"):
        vl_template.encode(image_trajectories(1)[0])
    monkeypatch.setattr(_vision, "MAX_IMAGES_PER_SAMPLE", 1)
    monkeypatch.setattr(_vision, "MAX_IMAGE_PIXELS", 4096 * 4096)
    with pytest.raises(ValueError, match="MAX_IMAGES_PER_SAMPLE"):
        vl_template.encode(two_image_trajectory())


def test_placeholder_text_cannot_fake_an_image(vl_template):
    trajectory = image_trajectories(1)[0]
    trajectory["messages"][0]["content"][1]["text"] = "look <|image_pad|>"
    with pytest.raises(ValueError, match="placeholders for 1 images"):
        vl_template.encode(trajectory)


def test_truncation_never_cuts_an_image():
    sample = image_trajectories(1)[0]
    encoded = Qwen3_5Template(model_id=VL_MODEL).encode(sample)
    full = encoded["length"]
    right = Qwen3_5Template(model_id=VL_MODEL, max_length=full - 2, truncation_strategy="right")
    assert right.encode(sample)["length"] == full - 2  # the cut only takes answer tokens
    image_pad = Qwen3_5Template(model_id=VL_MODEL).tokenizer.get_vocab()[_vision.IMAGE_PAD]
    pad = encoded["input_ids"].tolist().index(image_pad)
    left = Qwen3_5Template(model_id=VL_MODEL, max_length=full - pad - 1, truncation_strategy="left")
    with pytest.raises(ValueError, match="cut image tokens"):
        left.encode(sample)
    delete = Qwen3_5Template(model_id=VL_MODEL, max_length=8, truncation_strategy="delete")
    assert delete.encode(sample) is None


def test_processor_concatenates_images_of_the_rows_that_have_them(vl_template):
    text, image, two = (
        vl_template.encode(text_trajectories(1)[0]),
        vl_template.encode(image_trajectories(1)[0]),
        vl_template.encode(two_image_trajectory()),
    )
    batch = InputProcessor(pad_token_id=vl_template.pad_token_id, return_tensors="np")(
        [text, image, two]
    )
    assert batch["input_ids"].shape[0] == 3
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [1, 6, 6]]
    np.testing.assert_array_equal(
        batch["pixel_values"], np.concatenate([image["pixel_values"], two["pixel_values"]])
    )
    assert batch["pixel_values"].dtype == np.float32
    bad = dict(image, pixel_values=image["pixel_values"][:3])
    with pytest.raises(ValueError, match="patch rows"):
        InputProcessor()([bad])


def test_dataset_encodes_the_builtin_multimodal_set():
    ds = Dataset(DatasetMeta("builtin://self-cognition-vl"))
    ds.set_template("Qwen3_5Template", model_id=VL_MODEL, max_length=128)
    ds.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
    ds.encode(load_from_cache_file=False)
    assert len(ds) == 36
    assert {"pixel_values", "image_grid_thw"} <= set(ds.column_names)
    direct = Qwen3_5Template(model_id=VL_MODEL, max_length=128).encode(image_trajectories(36)[7])
    row = ds[7]
    assert row["input_ids"].tolist() == direct["input_ids"].tolist()
    np.testing.assert_allclose(row["pixel_values"], direct["pixel_values"], rtol=1e-6)
    assert row["image_grid_thw"].tolist() == direct["image_grid_thw"].tolist()
    decoded = ds.template.decode(row["labels"][row["labels"] != IGNORE_INDEX])
    assert "Twinkle" in decoded or "ModelScope" in decoded or "." in decoded
