"""The 0.38 sampling fields and the gspo / stable_reinforce losses through the unmodified SDK.

Expected values come from the tiny model itself (transformers, float32, one full forward).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
import torch
from sdk_version import requires_sdk
from tinker import types

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
PROMPT = [11, 200, 3000, 45, 77, 1234, 9, 512]


@pytest.fixture(scope="module")
def reference():
    """``tokens -> [len(tokens), V]`` float64 log-softmax of the tiny base model's logits."""
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_model_dir

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_dir("tiny://qwen3.5"), dtype=torch.float32
    ).eval()

    def log_softmax(tokens: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1).numpy()

    return log_softmax


@pytest.fixture(scope="module")
def base_sampler(service):
    return service.create_sampling_client(base_model=BASE_MODEL).result(timeout=60)


@pytest.fixture(scope="module")
def trainer(service):
    return service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)


def _check_topk(rows, lps_T_V, k):
    for row, lps_V in zip(rows, lps_T_V):
        assert len(row) == k
        ids = [t for t, _ in row]
        np.testing.assert_allclose([lp for _, lp in row], np.sort(lps_V)[::-1][:k], atol=1e-5)
        np.testing.assert_allclose([lps_V[t] for t in ids], [lp for _, lp in row], atol=1e-5)


@requires_sdk("0.33", "topk_sample_logprobs")
def test_topk_prompt_and_sample_logprobs_are_the_models_log_softmax(base_sampler, reference):
    out = base_sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=3, seed=5),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=4,
        topk_sample_logprobs=3,
    ).result(timeout=60)
    lps = reference(PROMPT)
    assert out.topk_prompt_logprobs[0] is None and len(out.topk_prompt_logprobs) == len(PROMPT)
    # Row t scores prompt position t, predicted by the logits at t - 1.
    _check_topk(out.topk_prompt_logprobs[1:], lps[:-1], 4)
    assert out.topk_prompt_logprobs_np.token_ids.shape == (len(PROMPT), 4)
    for seq in out.sequences:
        full = reference(PROMPT + seq.tokens)
        assert len(seq.topk_logprobs) == len(seq.tokens)
        _check_topk(seq.topk_logprobs, full[len(PROMPT) - 1 : -1], 3)
        sampled = [full[len(PROMPT) - 1 + j, t] for j, t in enumerate(seq.tokens)]
        np.testing.assert_allclose(seq.logprobs, sampled, atol=1e-5)


@requires_sdk("0.33", "prompt_logprobs_last_n")
def test_prompt_logprobs_last_n_scores_exactly_n(base_sampler):
    prompt = types.ModelInput.from_ints(PROMPT)
    full = base_sampler.compute_logprobs(prompt).result(timeout=60)
    last = base_sampler.compute_logprobs(prompt, prompt_logprobs_last_n=3).result(timeout=60)
    assert len(last) == len(PROMPT)
    assert last[:-3] == [None] * (len(PROMPT) - 3)
    assert last[-3:] == pytest.approx(full[-3:], abs=1e-5)
    out = base_sampler.sample(
        prompt,
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=2,
        prompt_logprobs_last_n=2,
    ).result(timeout=60)
    assert sum(row is not None for row in out.topk_prompt_logprobs) == 2
    with pytest.raises(tinker.BadRequestError, match="prompt_logprobs_last_n"):
        base_sampler.compute_logprobs(prompt, prompt_logprobs_last_n=len(PROMPT)).result(timeout=60)


@requires_sdk("0.33", "target_prompt_logprobs")
def test_target_prompt_logprobs_dense_and_sparse(base_sampler, reference):
    lps = reference(PROMPT)
    ids = np.full((len(PROMPT) - 1, 2), -1, dtype=np.int64)
    ids[:, 0] = PROMPT[1:]
    ids[2, 1], ids[5, 1] = 7, 4000
    expected = np.where(ids >= 0, np.take_along_axis(lps[:-1], np.maximum(ids, 0), 1), 0.0)
    for tensor in (
        types.TensorData.from_numpy(ids),
        types.TensorData.from_torch_sparse(torch.from_numpy(ids), pad_value=-1),
    ):
        out = base_sampler.sample(
            types.ModelInput.from_ints(PROMPT),
            1,
            types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            target_prompt_logprobs=tensor,
        ).result(timeout=60)
        got = out.target_prompt_logprobs.to_numpy()
        assert got.shape == ids.shape
        np.testing.assert_allclose(got, expected, atol=1e-5)
        # Column 0 asks for the prompt's own tokens: the prompt logprobs.
        np.testing.assert_allclose(got[:, 0], out.prompt_logprobs[1:], atol=1e-6)


@requires_sdk("0.33", "prompt_alt_tokens_k")
def test_prompt_alt_tokens_are_draws_with_their_logprobs(base_sampler, reference):
    lps = reference(PROMPT)
    for temperature in (1.0, 0.0):
        out = base_sampler.sample(
            types.ModelInput.from_ints(PROMPT),
            1,
            types.SamplingParams(max_tokens=1, temperature=temperature, seed=2),
            prompt_alt_tokens_k=3,
        ).result(timeout=60)
        tokens = out.prompt_alt_tokens.tokens.to_numpy()
        logprobs = out.prompt_alt_tokens.logprobs.to_numpy()
        assert tokens.shape == logprobs.shape == (len(PROMPT) - 1, 3)
        np.testing.assert_allclose(logprobs, np.take_along_axis(lps[:-1], tokens, 1), atol=1e-5)
        if temperature == 0.0:
            assert (tokens == lps[:-1].argmax(-1)[:, None]).all()


def _provenance_datum(prompt: list[int], seq, advantage: float, sequence_id: str):
    tokens = seq.tokens
    ob_len = len(prompt) - 1
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(prompt + tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": [0] * ob_len + tokens,
            "logprobs": [0.0] * ob_len + seq.logprobs,
            "advantages": [0.0] * ob_len + [advantage] * len(tokens),
        },
    )
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=len(tokens) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=ob_len),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=len(tokens)),
        ],
    )


@requires_sdk("0.27", "record_stability_info")
def test_stable_reinforce_uses_the_recorded_sampler_logprobs(trainer):
    sampler = trainer.save_weights_and_get_sampling_client(record_stability_info=True).result(
        timeout=60
    )
    out = sampler.sample(
        types.ModelInput.from_ints(PROMPT), 2, types.SamplingParams(max_tokens=4, seed=9)
    ).result(timeout=60)
    advantages = [1.0, -0.5]
    data = [
        _provenance_datum(PROMPT, seq, a, seq.sequence_id)
        for seq, a in zip(out.sequences, advantages)
    ]
    config = {"clip_high_threshold": 1.5, "kl_coeff": 0.1}
    result = trainer.forward(data, "stable_reinforce", config).result(timeout=60)
    expected = 0.0
    for seq, a, output in zip(out.sequences, advantages, result.loss_fn_outputs):
        lp = output["logprobs"].to_numpy()[len(PROMPT) - 1 :].astype(np.float64)
        q = np.asarray(seq.logprobs, dtype=np.float64)
        w = np.minimum(np.exp(lp - q), 1.5)
        d = q - lp
        expected += float(np.sum(-w * a * lp + 0.1 * (np.exp(d) - d - 1)))
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    # Same weights as the sampler: the trained logprobs match the recorded ones.
    lp0 = result.loss_fn_outputs[0]["logprobs"].to_numpy()[len(PROMPT) - 1 :]
    np.testing.assert_allclose(lp0, out.sequences[0].logprobs, atol=1e-3)
    with pytest.raises(tinker.BadRequestError, match="no stability record"):
        trainer.forward(
            [_provenance_datum(PROMPT, out.sequences[0], 1.0, "nope:0")], "stable_reinforce"
        ).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="provenance"):
        plain = types.Datum(
            model_input=data[0].model_input, loss_fn_inputs=dict(data[0].loss_fn_inputs)
        )
        trainer.forward([plain], "stable_reinforce").result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="kl_coeff"):
        trainer.forward(data, "stable_reinforce", {"beta": 1.0}).result(timeout=60)


@requires_sdk("0.27", "loss_fn 'gspo' (older SDKs check loss names themselves)")
def test_gspo_with_the_cookbooks_sequence_ratio_mask(trainer):
    prompt, completion = PROMPT[:5], [300, 301, 302, 303]
    tokens = prompt + completion
    n = len(tokens) - 1
    first = trainer.forward(
        [
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n},
            )
        ],
        "cross_entropy",
    ).result(timeout=60)
    lp = first.loss_fn_outputs[0]["logprobs"].to_numpy().astype(np.float64)
    mask = np.array([0.0] * (len(prompt) - 1) + [1.0] * len(completion))
    q = lp - np.where(mask > 0, [0.0, 0.0, 0.0, 0.0, 0.02, -0.01, 0.03, 0.0], 0.0)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": q.astype(np.float32),
            "advantages": (mask * 2.0).astype(np.float32),
            "sequence_ratio_mask": mask.astype(np.float32),
        },
    )
    out = trainer.forward(
        [datum], "gspo", {"clip_low_threshold": 0.99, "clip_high_threshold": 1.01}
    ).result(timeout=60)
    # s = exp(mean(0.02, -0.01, 0.03, 0.0)) = exp(0.01) = 1.01005 > 1.01: clipped, 4 tokens * A=2.
    assert math.exp(0.01) > 1.01
    assert out.metrics["loss:sum"] == pytest.approx(-4 * 2.0 * 1.01, rel=1e-4)


@requires_sdk("0.27", "sending an unknown loss_fn (older SDKs check loss names themselves)")
def test_unknown_loss_names_are_a_400_listing_the_valid_ones(trainer):
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT[:-1]),
        loss_fn_inputs={"target_tokens": PROMPT[1:], "weights": [1.0] * (len(PROMPT) - 1)},
    )
    with pytest.raises(tinker.BadRequestError, match="gspo.*stable_reinforce"):
        trainer.forward([datum], "no_such_loss").result(timeout=60)  # type: ignore[arg-type]
