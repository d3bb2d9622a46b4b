"""ModelScope Twinkle's sampling surface on our samplers: ``new_input_feature``, per-token
``(token_id, logprob)`` pairs, its ``SamplingParams`` forms, ``sample(num_samples=...)`` and
``add_adapter_to_sampler``; in-process on the mock and torch samplers."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import twinkle.data_format
from twinkle.errors import ArgumentTypeError, InvalidArgumentError, UnknownAdapterError
from twinkle.sampler import MockSampler, SamplingParams, TokenLogprob, TorchSampler

MODEL_ID = "tiny://qwen3"
TRAJ = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 3?"},
    ],
    "extra": {"answer": "5"},
}


@pytest.fixture(scope="module")
def mock():
    sampler = MockSampler(MODEL_ID)
    sampler.set_template("Template")
    return sampler


@pytest.fixture(scope="module")
def torch_sampler():
    sampler = TorchSampler(MODEL_ID)
    sampler.set_template("Template")
    return sampler


def test_new_input_feature_is_the_prompt_plus_completion_with_the_reply_appended(mock):
    (result,) = mock.sample(
        inputs=[TRAJ],
        sampling_params={"max_tokens": 6, "temperature": 1.0, "seed": 4},
        num_samples=3,
    )
    prompt = result.prompt_tokens
    assert len(result.sequences) == 3
    for seq in result.sequences:
        feature = seq.new_input_feature
        assert feature["input_ids"].tolist() == prompt + seq.tokens
        assert feature["labels"].tolist() == [-100] * len(prompt) + seq.tokens
        assert feature["old_logprobs"].tolist()[len(prompt) :] == pytest.approx(seq.logprobs)
        assert feature["messages"] == [
            *TRAJ["messages"],
            {"role": "assistant", "content": seq.text},
        ]
        assert feature["extra"] == {"answer": "5"}
    # Each sequence holds its own copy: appending a turn to one leaves the input and the others.
    assert len(TRAJ["messages"]) == 2
    first, second = (s.new_input_feature["messages"] for s in result.sequences[:2])
    assert first is not second


def test_an_encoded_feature_with_messages_is_sampled_from_its_own_tokens(mock):
    ids = [15, 27, 99, 4]
    feature = {"input_ids": ids, "messages": TRAJ["messages"], "user_data": [["level", 3]]}
    (result,) = mock.sample(feature, {"max_tokens": 3, "temperature": 0.0})
    assert result.prompt_tokens == ids
    (seq,) = result.sequences
    assert seq.new_input_feature["input_ids"].tolist() == ids + seq.tokens
    assert seq.new_input_feature["user_data"] == [["level", 3]]
    assert seq.new_input_feature["messages"][-1] == {"role": "assistant", "content": seq.text}


def test_an_encoded_prompt_without_messages_gets_the_reply_as_its_message(mock):
    """Upstream's GRPO scripts score ``new_input_feature``s of encoded prompts with rewards that
    read the completion from ``messages``: a prompt of token ids gets the reply as its message,
    and the row's ``user_data`` (the reference answer) rides along."""
    from twinkle.reward import GSM8KAccuracyReward

    ids = [15, 27, 99, 4]
    feature = {"input_ids": ids, "user_data": [["ground_truth", "4"]]}
    (result,) = mock.sample(feature, {"max_tokens": 3, "temperature": 0.0})
    (seq,) = result.sequences
    assert seq.new_input_feature["messages"] == [{"role": "assistant", "content": seq.text}]
    assert seq.new_input_feature["user_data"] == [["ground_truth", "4"]]
    reward = GSM8KAccuracyReward()([seq.new_input_feature], [])
    assert list(reward) == [0.0]  # the mock's random tokens are not the answer "#### 4"


def test_logprobs_as_a_count_give_token_logprob_pairs(mock):
    (result,) = mock.sample(
        [[11, 12, 13]], {"max_tokens": 5, "temperature": 1.0, "seed": 2, "logprobs": 3}
    )
    (seq,) = result.sequences
    assert len(seq.logprobs) == len(seq.tokens) == 5
    # What upstream's GRPO scripts compute for old_logps: the sampled token's log-prob.
    old = [lp[0][1] for lp in seq.logprobs]
    assert old == [float(lp) for lp in seq.logprobs]
    previous = [13, *seq.tokens[:-1]]
    for lp, token, top, prev in zip(seq.logprobs, seq.tokens, seq.topk_logprobs, previous):
        assert isinstance(lp, TokenLogprob) and lp[0][0] == lp.token_id == token
        assert len(top) == 3
        assert list(lp.pairs[1:]) == [p for p in top if p[0] != token]
        # The top 3 are the mock model's three most likely tokens after the previous one.
        scores = mock._logprobs(prev, None)
        assert [t for t, _ in top] == sorted(range(mock.vocab_size), key=lambda t: -scores[t])[:3]
    # Still floats for our own code: numpy and JSON see the sampled token's log-prob.
    np.testing.assert_allclose(np.asarray(seq.logprobs), old)


def test_default_logprobs_stay_plain_floats(mock):
    (result,) = mock.sample([[11, 12, 13]], {"max_tokens": 4, "seed": 1})
    (seq,) = result.sequences
    assert all(type(lp) is float for lp in seq.logprobs)
    assert torch.tensor(seq.logprobs).shape == (4,)


def test_topk_pairs_on_the_torch_sampler(torch_sampler):
    (result,) = torch_sampler.sample(
        [[101, 202, 303]], {"max_tokens": 4, "temperature": 0.0, "logprobs": 2}
    )
    (seq,) = result.sequences
    for lp, token, top in zip(seq.logprobs, seq.tokens, seq.topk_logprobs):
        # Greedy: the sampled token is the most likely one, so it leads the top 2.
        assert top[0][0] == token and lp[0] == (token, pytest.approx(top[0][1], abs=1e-5))
        assert lp.pairs[1:] == tuple(top[1:])


def test_include_stop_str_in_output_keeps_the_stop_string(torch_sampler):
    params = {"max_tokens": 12, "temperature": 0.0}
    (free,) = torch_sampler.sample([TRAJ], params)
    text = free.sequences[0].text
    if len(text) < 4:
        pytest.skip(f"the tiny model's greedy text is too short to cut: {text!r}")
    stop = text[2:4]
    (cut,) = torch_sampler.sample([TRAJ], {**params, "stop": [stop]})
    (kept,) = torch_sampler.sample(
        [TRAJ], {**params, "stop": [stop], "include_stop_str_in_output": True}
    )
    start = text.find(stop)
    assert cut.sequences[0].text == text[:start]
    assert kept.sequences[0].text == text[: start + len(stop)]


@dataclass
class UpstreamParams:
    """A params object with ModelScope Twinkle's field names and defaults."""

    max_tokens: int | None = None
    seed: int | None = None
    stop: object = None
    include_stop_str_in_output: bool = False
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    num_samples: int = 1


def test_sampling_params_accept_upstream_forms():
    assert twinkle.data_format.SamplingParams is SamplingParams
    params = SamplingParams.coerce(UpstreamParams(stop=[7, 8], logprobs=1, num_samples=4))
    assert params.max_tokens == 256
    assert params.stop == () and params.stop_token_ids == (7, 8)
    assert params.logprobs is True and params.topk_logprobs == 1 and params.logprob_pairs
    assert params.prompt_logprobs is False and params.num_samples == 4
    assert (
        SamplingParams(logprobs=0).logprob_pairs and SamplingParams(logprobs=0).topk_logprobs == 0
    )
    assert SamplingParams(prompt_logprobs=2).topk_prompt_logprobs == 2
    assert SamplingParams.from_dict({"max_new_tokens": 9, "stop": "</a>"}).max_tokens == 9
    with pytest.raises(ValueError, match="logprobs must be a bool or an integer >= 0"):
        SamplingParams(logprobs=-1)
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"max_tokenz": 3})


def test_num_samples_argument(mock):
    (result,) = mock.sample([[5, 6]], {"max_tokens": 2}, num_samples=3)
    assert len(result.sequences) == 3
    (result,) = mock.sample([[5, 6]], {"max_tokens": 2, "num_samples": 3}, num_samples=3)
    assert len(result.sequences) == 3
    with pytest.raises(InvalidArgumentError, match="num_samples=2 but sampling_params"):
        mock.sample([[5, 6]], {"max_tokens": 2, "num_samples": 3}, num_samples=2)


def test_responses_read_like_dicts(mock):
    response = mock.sample([[5, 6], [7, 8]], {"max_tokens": 2}, num_samples=2)
    assert response.get("sequences") == response.sequences and len(response.sequences) == 4
    assert response.get("prompt_logprobs", "none") == "none"
    seq = response.sequences[0]
    assert seq.get("new_input_feature") is seq.new_input_feature
    assert seq.get("decoded") == seq.text and seq.get("tokens") == seq.tokens
    assert seq.get("missing", 1) == 1
    assert response[0].prompt_token_ids == [5, 6]


def test_add_adapter_to_sampler_samples_the_base_model_until_weights_arrive(mock):
    from peft import LoraConfig

    params = {"max_tokens": 5, "temperature": 1.0, "seed": 9}
    mock.add_adapter_to_sampler("policy", LoraConfig(r=8, lora_alpha=32))
    base = mock.sample([[3, 4, 5]], params)
    declared = mock.sample([[3, 4, 5]], params, adapter_name="policy")
    assert declared.sequences[0].tokens == base.sequences[0].tokens
    assert mock.sample([[3, 4, 5]], params, adapter_name="").sequences[0].tokens == (
        base.sequences[0].tokens
    )
    with pytest.raises(UnknownAdapterError, match="unknown adapter_name 'other'"):
        mock.sample([[3, 4, 5]], params, adapter_name="other")
    with pytest.raises(InvalidArgumentError, match="config.r must be an integer >= 1"):
        mock.add_adapter_to_sampler("bad", {"r": 0})
    with pytest.raises(ArgumentTypeError, match="config must be a PEFT LoraConfig or a dict"):
        mock.add_adapter_to_sampler("bad", 8)
    with pytest.raises(InvalidArgumentError, match="adapter_name must be a non-empty string"):
        mock.add_adapter_to_sampler("", {"r": 4})


def test_new_input_features_train_like_the_result_features(torch_sampler):
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel

    response = torch_sampler.sample(
        [TRAJ], {"max_tokens": 4, "seed": 0, "logprobs": 1}, num_samples=2
    )
    model = MultiLoraTransformersModel(MODEL_ID)
    model.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=8))
    upstream = model.forward_only(inputs=[s.new_input_feature for s in response.sequences])
    ours = model.forward_only(inputs=response.features())
    # The extra keys (messages, extra) ride along and change nothing.
    assert float(upstream["loss"]) == pytest.approx(float(ours["loss"]))
