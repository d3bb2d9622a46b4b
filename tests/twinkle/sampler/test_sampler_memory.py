"""The torch sampler's memory budget: rows that would not fit decode in groups that do, with the
same results; a row that cannot fit alone is refused before any work, saying what fits."""

from __future__ import annotations

import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.sampler import TorchSampler
from twinkle.sampler import torch_sampler as torch_sampler_module
from twinkle.sampler._memory import DecodeShape, fit_row_groups

SHAPE = DecodeShape(hidden=64, intermediate=128, layers=2, vocab=4096, kv_dim=32, dtype_bytes=4)


def test_the_memory_model_grows_with_rows_tokens_and_kept_logits():
    one = SHAPE.batch_bytes(1, 100, 16, prompt_logits=False)
    assert SHAPE.batch_bytes(2, 100, 16, prompt_logits=False) == 2 * one
    assert SHAPE.batch_bytes(1, 200, 16, prompt_logits=False) > one
    # Keeping the prompt's logits costs width x vocab x (dtype + fp32 copy + log-softmax).
    kept = SHAPE.batch_bytes(1, 100, 16, prompt_logits=True)
    assert kept - one == 99 * 4096 * 12
    eager = DecodeShape(**{**SHAPE.__dict__, "quadratic_heads": 4})
    assert eager.batch_bytes(1, 100, 16, prompt_logits=False) - one == 2 * 4 * 100 * 100 * 4


def test_rows_are_grouped_to_fit_and_every_row_is_in_exactly_one_group():
    lengths = [10, 50, 20, 200, 30, 30]
    limit = SHAPE.batch_bytes(2, 200, 8, prompt_logits=False)
    groups = fit_row_groups(
        SHAPE, lengths, 8, limit, prompt_logits=False, budget_mb=100, row_label=str
    )
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    for g in groups:
        width = max(lengths[i] for i in g)
        assert SHAPE.batch_bytes(len(g), width, 8, prompt_logits=False) <= limit
    assert len(groups) > 1
    # With room for everything, one group.
    big = SHAPE.batch_bytes(len(lengths), 200, 8, prompt_logits=False)
    assert fit_row_groups(
        SHAPE, lengths, 8, big, prompt_logits=False, budget_mb=None, row_label=str
    ) == [range(0, len(lengths))]


def test_a_row_that_cannot_fit_alone_is_refused_with_what_fits():
    limit = SHAPE.batch_bytes(1, 300, 0, prompt_logits=False)
    with pytest.raises(InvalidArgumentError) as info:
        fit_row_groups(
            SHAPE,
            [10, 400],
            50,
            limit,
            prompt_logits=False,
            budget_mb=77,
            row_label=lambda i: f"inputs[{i}]",
        )
    message = str(info.value)
    assert message.startswith("inputs[1] needs about")
    assert "memory_budget_mb=77" in message
    assert "about 300 tokens of prompt and completion fit" in message


@pytest.fixture(scope="module")
def sampler():
    return TorchSampler("tiny://qwen3", device="cpu")


def _prompts():
    return [{"input_ids": list(range(5 + 7 * i, 5 + 7 * i + 4 + 3 * i))} for i in range(4)]


def test_a_batch_over_the_budget_decodes_in_groups_with_the_same_results(sampler, monkeypatch):
    params = {"max_tokens": 6, "temperature": 0.0, "logprobs": True}
    whole = sampler.sample(_prompts(), params, num_samples=2)
    calls = []
    decode = sampler._decode

    def counting_decode(rows, *args, **kwargs):
        calls.append(len(rows))
        return decode(rows, *args, **kwargs)

    shape = DecodeShape.of(sampler.model)
    # Room for two rows of the widest prompt at a time.
    room = shape.batch_bytes(2, 14, 6, prompt_logits=False)
    monkeypatch.setattr(torch_sampler_module, "memory_limit_bytes", lambda device, budget: room)
    monkeypatch.setattr(sampler, "_decode", counting_decode)
    split = sampler.sample(_prompts(), params, num_samples=2)
    assert len(calls) > 1 and sum(calls) == 8 and max(calls) <= 2
    for a, b in zip(whole, split):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
        for sa, sb in zip(a.sequences, b.sequences):
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-5)


def test_a_prompt_that_cannot_fit_is_refused_before_decoding(sampler, monkeypatch):
    shape = DecodeShape.of(sampler.model)
    room = shape.batch_bytes(1, 8, 0, prompt_logits=False)
    monkeypatch.setattr(torch_sampler_module, "memory_limit_bytes", lambda device, budget: room)
    monkeypatch.setattr(sampler, "_decode", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(
        InvalidArgumentError,
        match=r"inputs\[2\] needs about [0-9.]+ MiB to sample \(10 prompt tokens",
    ):
        sampler.sample(_prompts(), {"max_tokens": 4})
