"""ModelScope Twinkle's Tinker extensions through the unmodified SDK, shaped as their
``cookbook/client/tinker/dpo.py`` sends them: a ``disable_lora`` reference ``forward``, then
DPO through ``importance_sampling`` with ``ref_logps`` and ``dpo_beta`` / ``dpo_sft_weight``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
from tinker import types

from twinkle.server.model.tinker_datum import input_feature_to_datum

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
RNG = np.random.default_rng(7)


def _feature(prompt: list[int], answer: list[int]) -> dict:
    return {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}


PROMPT = RNG.integers(10, 4000, size=8).tolist()
PAIRS = [
    (_feature(PROMPT, RNG.integers(10, 4000, size=6).tolist()),
     _feature(PROMPT, RNG.integers(10, 4000, size=5).tolist()))
    for _ in range(2)
]  # fmt: skip


def _datums() -> list[types.Datum]:
    return [input_feature_to_datum(f) for pair in PAIRS for f in pair]  # chosen, rejected, ...


def _logprobs(output) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].tolist(), dtype=np.float64) for o in output.loss_fn_outputs]


def _reference(client, datums) -> list[np.ndarray]:
    out = client.forward(datums, "cross_entropy", loss_fn_config={"disable_lora": True})
    return _logprobs(out.result(timeout=60))


def _with_refs(datums, refs) -> list[types.Datum]:
    for datum, ref in zip(datums, refs):
        datum.loss_fn_inputs["ref_logps"] = types.TensorData.from_numpy(ref.astype(np.float32))
    return datums


@pytest.fixture(scope="module")
def carol(service):
    return service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)


def test_the_upstream_import_path_converts_features():
    datum = input_feature_to_datum(PAIRS[0][0])
    assert datum.model_input.to_ints() == PAIRS[0][0]["input_ids"][:-1]
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0] * 7 + [1.0] * 6


def test_dpo_through_importance_sampling_trains_the_preference(carol):
    datums = _datums()
    refs = _reference(carol, datums)
    weights = [d.loss_fn_inputs["weights"].to_numpy() for d in datums]
    # At the start the adapter is zero: the policy is the reference, every margin 0, loss ln 2.
    first = carol.forward_backward(
        _with_refs(_datums(), refs), "importance_sampling", loss_fn_config={"dpo_beta": 0.1}
    ).result(timeout=60)
    assert first.metrics["loss:sum"] == pytest.approx(math.log(2), rel=1e-4)
    assert first.metrics["dpo/reward_margin:mean"] == pytest.approx(0.0, abs=1e-5)
    np.testing.assert_allclose(_logprobs(first)[0], refs[0], atol=1e-5)
    # The SFT term adds the chosen rows' mean cross entropy per trained token.
    with_sft = carol.forward(
        _with_refs(_datums(), refs),
        "importance_sampling",
        loss_fn_config={"dpo_beta": 0.1, "dpo_sft_weight": 1.0},
    ).result(timeout=60)
    chosen = [(lp * w).sum() for lp, w in zip(refs[0::2], weights[0::2])]
    sft = -sum(chosen) / sum(w.sum() for w in weights[0::2])
    assert with_sft.metrics["loss:sum"] == pytest.approx(math.log(2) + sft, rel=1e-4)
    carol.optim_step(types.AdamParams(learning_rate=2e-2)).result(timeout=60)
    for _ in range(3):
        step = carol.forward_backward(
            _with_refs(_datums(), refs), "importance_sampling", loss_fn_config={"dpo_beta": 0.1}
        ).result(timeout=60)
        carol.optim_step(types.AdamParams(learning_rate=2e-2)).result(timeout=60)
    assert step.metrics["dpo/reward_margin:mean"] > 0
    assert step.metrics["dpo/reward_accuracy:mean"] == 1.0
    assert step.metrics["loss:sum"] < math.log(2)


def test_disable_lora_is_the_base_model_after_training(carol):
    datums = _datums()
    before = _reference(carol, datums)
    carol.forward_backward(datums, "cross_entropy").result(timeout=60)
    carol.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=60)
    adapted = _logprobs(carol.forward(datums, "cross_entropy").result(timeout=60))
    out = carol.forward(datums, "cross_entropy", loss_fn_config={"disable_lora": True})
    out = out.result(timeout=60)
    for ref, now, new in zip(before, _logprobs(out), adapted):
        np.testing.assert_allclose(now, ref, atol=1e-5)  # the base model did not move
        assert np.abs(new - ref).max() > 1e-4  # the adapter did
    weights = [d.loss_fn_inputs["weights"].to_numpy() for d in datums]
    expected = -sum(float((lp * w).sum()) for lp, w in zip(_logprobs(out), weights))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    # As a forward_backward it trains nothing: the adapter's outputs stay where they were.
    carol.forward_backward(datums, "cross_entropy", loss_fn_config={"disable_lora": True}).result(
        timeout=60
    )
    again = _logprobs(carol.forward(datums, "cross_entropy").result(timeout=60))
    for a, b in zip(again, adapted):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    ("datums", "loss_fn", "config", "message"),
    [
        (lambda refs: _with_refs(_datums(), refs)[:3], "importance_sampling", {},
         "pairs of datums; got 3"),
        (lambda refs: _with_refs(_datums()[:2], refs[:1]) + _datums()[2:], "importance_sampling",
         {}, "needs 'ref_logps'"),
        (lambda refs: _with_refs(_datums(), refs), "importance_sampling", {"epsilon": 0.2},
         "does not take loss_fn_config \\['epsilon'\\]"),
        (lambda refs: _datums(), "ppo", {"disable_lora": 1.0}, "use loss_fn 'cross_entropy'"),
    ],
)  # fmt: skip
def test_misuse_is_a_400_naming_it(carol, datums, loss_fn, config, message):
    refs = _reference(carol, _datums())
    with pytest.raises(tinker.BadRequestError, match=message):
        carol.forward_backward(datums(refs), loss_fn, loss_fn_config=config).result(timeout=60)
