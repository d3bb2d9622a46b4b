"""InputProcessor: padding values, masks, positions and extra keys."""

import numpy as np
import pytest
import torch

from twinkle.data_format import InputFeature
from twinkle.processor import InputProcessor, get_processor, list_processors

A = InputFeature(input_ids=[11, 12, 13], labels=[-100, 12, 13])
B = {"input_ids": [21], "labels": [21]}


def test_right_padding_values():
    batch = InputProcessor(padding_side="right", pad_token_id=7)([A, B])
    assert batch["input_ids"].tolist() == [[11, 12, 13], [21, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 12, 13], [21, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert all(isinstance(v, torch.Tensor) and v.dtype == torch.int64 for v in batch.values())


def test_left_padding_values():
    batch = InputProcessor(padding_side="left", pad_token_id=7)([A, B])
    assert batch["input_ids"].tolist() == [[11, 12, 13], [7, 7, 21]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 12, 13], [-100, -100, 21]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_left_padding_positions_start_at_first_real_token():
    batch = InputProcessor(padding_side="left", return_tensors="np")(
        [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}]
    )
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]
    assert batch["labels"].tolist() == [[-100] * 4] * 2  # no labels given: nothing trained


def test_default_pad_is_zero_and_numpy_output():
    batch = InputProcessor(return_tensors="np")([A, B])
    assert isinstance(batch["input_ids"], np.ndarray)
    assert batch["input_ids"].tolist() == [[11, 12, 13], [21, 0, 0]]


def test_extra_keys_are_padded_or_stacked():
    a = dict(A, advantages=[0.5, 0.5, 0.5], reward=1.0, note="text")
    b = dict(B, advantages=[2.0], reward=0.0, note="more")
    batch = InputProcessor(padding_side="left", return_tensors="np")([a, b])
    assert batch["advantages"].tolist() == [[0.5, 0.5, 0.5], [0.0, 0.0, 2.0]]
    assert batch["advantages"].dtype == np.float32
    assert batch["reward"].tolist() == [1.0, 0.0]
    assert "note" not in batch and "length" not in batch


def test_extra_key_errors():
    proc = InputProcessor(return_tensors="np")
    with pytest.raises(ValueError, match="only some samples"):
        proc([dict(A, advantages=[1.0, 1.0, 1.0]), B])
    with pytest.raises(ValueError, match="advantages"):
        proc([dict(A, advantages=[1.0]), dict(B, advantages=[1.0])])
    with pytest.raises(ValueError, match="empty batch"):
        proc([])


def test_bad_arguments():
    with pytest.raises(ValueError, match="padding_side"):
        InputProcessor(padding_side="middle")
    with pytest.raises(ValueError, match="return_tensors"):
        InputProcessor(return_tensors="tf")


def test_registry():
    assert "InputProcessor" in list_processors()
    proc = get_processor("InputProcessor", padding_side="left")
    assert isinstance(proc, InputProcessor) and proc.padding_side == "left"
    with pytest.raises(ValueError, match="InputProcessor"):
        get_processor("NoSuchProcessor")
