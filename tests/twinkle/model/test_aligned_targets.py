"""Tinker-style features: ``target_tokens`` already aligned with the positions (no shift)."""

import numpy as np
import pytest

from twinkle.model import MultiLoraTransformersModel


@pytest.fixture(scope="module")
def model():
    m = MultiLoraTransformersModel("tiny://qwen3", seed=0)
    m.add_adapter_to_model("a", {"r": 4, "init_lora_weights": False})
    return m


def test_aligned_target_tokens_match_shifted_labels_and_per_request_loss(model):
    ids = np.random.default_rng(0).integers(10, 4000, size=12)
    labels = ids.copy()
    labels[:3] = -100
    shifted = model.forward_only([{"input_ids": ids, "labels": labels}], adapter_name="a")
    weights = (labels[1:] != -100).astype(np.float32)
    aligned = model.forward_only(
        [{"input_ids": ids[:-1], "target_tokens": ids[1:], "weights": weights}],
        adapter_name="a",
        loss="cross_entropy",
    )
    lp = np.asarray(aligned["logprobs"][0])
    assert lp.shape == (11,)  # one logprob per position, trained or not
    np.testing.assert_allclose(lp[2:], shifted["logprobs"][0], rtol=1e-5, atol=1e-6)
    assert aligned["loss"] == pytest.approx(-float(np.dot(lp, weights)), rel=1e-5)


def test_aligned_rl_extras_are_not_shifted(model):
    ids = np.arange(20, 30)
    q = np.full(9, -1.0, dtype=np.float32)
    adv = np.zeros(9, dtype=np.float32)
    adv[4] = 1.0
    out = model.forward_only(
        [{"input_ids": ids[:-1], "target_tokens": ids[1:], "old_logprobs": q, "advantages": adv}],
        adapter_name="a",
        loss="importance_sampling",
    )
    lp = np.asarray(out["logprobs"][0])
    assert out["loss"] == pytest.approx(-float(np.exp(lp[4] + 1.0)), rel=1e-5)


def test_aligned_targets_out_of_vocabulary_are_refused(model):
    with pytest.raises(ValueError, match="target_tokens out of the vocabulary"):
        model.forward_only(
            [{"input_ids": [1, 2, 3], "target_tokens": [2, 3, 10**7]}],
            adapter_name="a",
            loss="cross_entropy",
        )
