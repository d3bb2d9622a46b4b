"""TorchSampler: log-probs, mixed-adapter batches, seeds, stops, prompt log-probs, cache."""

import numpy as np
import pytest
import torch

from tests.twinkle.sampler.conftest import prompts
from twinkle.sampler import SampleResult, SamplingParams, TorchSampler, training_feature


def _tokens(response):
    return [[seq.tokens for seq in result.sequences] for result in response]


def test_sampled_logprobs_equal_teacher_forced_forward(setup):
    _, trainer, sampler, paths = setup
    response = sampler.sample(prompts(), {"max_tokens": 6, "seed": 3}, adapter_uri=paths[1])
    out = trainer.forward_only(response, adapter_name="t1")
    for forward_lp, result in zip(out["logprobs"], response):
        np.testing.assert_allclose(forward_lp, result.sequences[0].logprobs, atol=1e-4)


def test_mixed_adapter_batch_equals_per_adapter_runs(setup):
    _, _, sampler, paths = setup
    ps = prompts(4)
    uris = [paths[0], paths[1], None, paths[2]]
    params = {"max_tokens": 5, "seed": 7, "num_samples": 2}
    mixed = sampler.sample(ps, params, adapter_uri=uris)
    for i, (prompt, uri) in enumerate(zip(ps, uris)):
        alone = sampler.sample([prompt], params, adapter_uri=uri)
        assert _tokens(alone)[0] == _tokens(mixed)[i]
        np.testing.assert_allclose(
            alone[0].sequences[1].logprobs, mixed[i].sequences[1].logprobs, atol=1e-5
        )


def test_adapters_change_the_samples(setup):
    _, _, sampler, paths = setup
    params = {"max_tokens": 6, "temperature": 0}
    outs = {_tuple(sampler.sample(prompts(2), params, adapter_uri=u)) for u in [None, *paths]}
    assert len(outs) == 4


def _tuple(response):
    return tuple(tuple(seq.tokens) for result in response for seq in result.sequences)


def test_same_seed_same_samples_and_other_seed_differs(setup):
    _, _, sampler, paths = setup
    first = sampler.sample(prompts(), {"max_tokens": 6, "seed": 11}, adapter_uri=paths[0])
    again = sampler.sample(prompts(), {"max_tokens": 6, "seed": 11}, adapter_uri=paths[0])
    other = sampler.sample(prompts(), {"max_tokens": 6, "seed": 12}, adapter_uri=paths[0])
    assert _tokens(first) == _tokens(again)
    assert _tokens(first) != _tokens(other)


def test_greedy_matches_argmax_of_forward(setup):
    _, trainer, sampler, paths = setup
    prompt = prompts(1)[0]
    seq = sampler.sample([prompt], {"max_tokens": 4, "temperature": 0}, adapter_uri=paths[0])[
        0
    ].sequences[0]
    ids = torch.tensor([prompt + seq.tokens[:-1]])
    from twinkle.model.lora import RowRoute

    name = "t0"
    with trainer.routes([RowRoute(name, 0, 1)]), torch.no_grad():
        logits = trainer.model(input_ids=ids).logits[0]
    expected = logits[len(prompt) - 1 :].argmax(-1).tolist()
    assert seq.tokens == expected


def test_stop_token_ids_and_template_eos(setup):
    _, _, sampler, paths = setup
    free = sampler.sample(prompts(1), {"max_tokens": 6, "temperature": 0}, adapter_uri=paths[0])[
        0
    ].sequences[0]
    stop_at = free.tokens[2]
    cut = sampler.sample(
        prompts(1),
        {"max_tokens": 6, "temperature": 0, "stop_token_ids": [stop_at]},
        adapter_uri=paths[0],
    )[0].sequences[0]
    assert cut.tokens == free.tokens[: free.tokens.index(stop_at) + 1]
    assert cut.stop_reason == "stop" and free.stop_reason == "length"
    eos = sampler.template.eos_token_id
    assert eos in sampler.stop_token_ids


def test_stop_strings_truncate_text(setup):
    _, _, sampler, paths = setup
    free = sampler.sample(prompts(1), {"max_tokens": 8, "temperature": 0}, adapter_uri=paths[1])[
        0
    ].sequences[0]
    piece = sampler.template.decode(free.tokens[3:4], skip_special_tokens=True)
    assert piece.strip(), "need a printable token for the stop string"
    cut = sampler.sample(
        prompts(1), {"max_tokens": 8, "temperature": 0, "stop": [piece]}, adapter_uri=paths[1]
    )[0].sequences[0]
    assert cut.stop_reason == "stop"
    assert piece not in cut.text and len(cut.tokens) <= 4
    assert free.text.startswith(cut.text)


def test_prompt_logprobs_with_max_tokens_zero(setup):
    _, trainer, sampler, paths = setup
    ps = prompts(2)
    response = sampler.sample(ps, {"max_tokens": 0}, adapter_uri=paths[2])
    features = [{"input_ids": p, "labels": p} for p in ps]
    out = trainer.forward_only(features, adapter_name="t2")
    for result, forward_lp, prompt in zip(response, out["logprobs"], ps):
        assert result.sequences == []
        assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(prompt)
        np.testing.assert_allclose(result.prompt_logprobs[1:], forward_lp, atol=1e-4)


def test_trajectory_inputs_use_template_generation_prompt(setup):
    _, _, sampler, _ = setup
    traj = {"messages": [{"role": "user", "content": "1+1="}], "extra": {"answer": 2}}
    result = sampler.sample(traj, {"max_tokens": 2, "seed": 0})[0]
    expected = sampler.template.encode(traj, add_generation_prompt=True)["input_ids"].tolist()
    assert result.prompt_tokens == expected and result.extra == {"answer": 2}


def test_training_feature_layout():
    from twinkle.sampler import SampledSequence

    feature = training_feature(
        [5, 6], SampledSequence(tokens=[7, 8], logprobs=[-0.5, -1.0], stop_reason="stop")
    )
    assert feature["input_ids"].tolist() == [5, 6, 7, 8]
    assert feature["labels"].tolist() == [-100, -100, 7, 8]
    np.testing.assert_allclose(feature["old_logprobs"], [0, 0, -0.5, -1.0])
    multi = SampleResult(prompt_tokens=[1], sequences=[feature_seq() for _ in range(2)])
    with pytest.raises(ValueError, match="features"):
        dict(multi)


def feature_seq():
    from twinkle.sampler import SampledSequence

    return SampledSequence(tokens=[3], logprobs=[-1.0], stop_reason="length")


@pytest.mark.parametrize(
    "bad",
    [{"max_tokens": -1}, {"temperature": -0.1}, {"top_p": 0}, {"num_samples": 0}, {"nope": 1}],
)
def test_invalid_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams.coerce(bad)


def test_qwen35_uses_its_cache(qwen35):
    model_id, _, _ = qwen35
    sampler = TorchSampler(model_id)
    sampler.sample(prompts(2), {"max_tokens": 3, "seed": 0})
    assert sampler.uses_cache is True


def test_top_k_one_is_greedy(setup):
    _, _, sampler, paths = setup
    greedy = sampler.sample(prompts(), {"max_tokens": 5, "temperature": 0}, adapter_uri=paths[0])
    top1 = sampler.sample(prompts(), {"max_tokens": 5, "top_k": 1, "seed": 5}, adapter_uri=paths[0])
    assert _tokens(greedy) == _tokens(top1)


def test_repetition_penalty_changes_greedy_choice(setup):
    _, _, sampler, _ = setup
    prompt = [[100, 100, 100, 100]]
    plain = sampler.sample(prompt, {"max_tokens": 8, "temperature": 0})[0].sequences[0].tokens
    penal = (
        sampler.sample(prompt, {"max_tokens": 8, "temperature": 0, "repetition_penalty": 50.0})[0]
        .sequences[0]
        .tokens
    )
    assert len(set(penal)) >= len(set(plain))
    assert 100 not in penal
