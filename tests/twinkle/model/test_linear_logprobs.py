"""Logits-free token log-probs at a real vocabulary size (Qwen3's 151,936): the chunked function
equals the materialised logits -> log-softmax path in values and gradients, for any chunk size."""

import pytest
import torch

from twinkle.model.step.linear_logprobs import linear_token_logprobs

QWEN3_VOCAB = 151_936


def _reference(hidden, weight, targets):
    logits = (hidden @ weight.T).float()
    logprobs = torch.log_softmax(logits, dim=-1)
    valid = targets != -100
    picked = logprobs.gather(-1, torch.where(valid, targets, 0)[..., None]).squeeze(-1)
    hits = valid & (logits.argmax(-1) == torch.where(valid, targets, 0))
    return torch.where(valid, picked, 0.0), hits


@pytest.mark.parametrize("chunk_bytes", [4 * QWEN3_VOCAB * 7, 64 << 20])  # 7-token chunks; one
def test_values_and_gradients_equal_the_materialised_logits(chunk_bytes):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 24, 32, generator=g, requires_grad=True)
    weight = (0.05 * torch.randn(QWEN3_VOCAB, 32, generator=g)).requires_grad_()
    targets = torch.randint(0, QWEN3_VOCAB, (2, 24), generator=g)
    targets[0, :5] = -100
    targets[1, 3] = int((hidden[1, 3] @ weight.T).argmax())  # one certain argmax hit
    upstream = torch.randn(2, 24, generator=g)

    got, hits, _ = linear_token_logprobs(hidden, weight, targets, chunk_bytes=chunk_bytes)
    (got * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected, expected_hits = _reference(hidden, weight, targets)
    (expected * upstream).sum().backward()

    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(hits, expected_hits) and bool(hits[1, 3])
    assert float(got[0, :5].abs().sum()) == 0.0
    # 1e-5 relative to each gradient's scale: a hidden state's gradient sums 151,936 terms, in
    # chunks here and in one matmul there.
    for got_grad, expected_grad in zip(grads, (hidden.grad, weight.grad)):
        scale = float(expected_grad.abs().max())
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-5 * scale)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_still_do():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 8, 16, generator=g, requires_grad=True)
    weight = 0.05 * torch.randn(QWEN3_VOCAB, 16, generator=g)  # frozen, as a LoRA base's head
    targets = torch.randint(0, QWEN3_VOCAB, (1, 8), generator=g)
    got, _, _ = linear_token_logprobs(hidden, weight, targets, chunk_bytes=4 * QWEN3_VOCAB * 3)
    got.sum().backward()
    expected, _ = _reference(hidden.detach().requires_grad_(), weight, targets)
    assert weight.grad is None and hidden.grad is not None
    torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-5)


def test_entropies_equal_the_softmax_entropy_and_the_frozen_head_gradient_is_exact():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 9, 16, generator=g, requires_grad=True)
    weight = 0.3 * torch.randn(QWEN3_VOCAB, 16, generator=g)  # frozen: the expected-row backward
    targets = torch.randint(0, QWEN3_VOCAB, (2, 9), generator=g)
    targets[1, :2] = -100
    upstream = torch.randn(2, 9, generator=g)
    stats = linear_token_logprobs(
        hidden, weight, targets, chunk_bytes=4 * QWEN3_VOCAB * 4, entropies=True
    )
    (stats.logprobs * upstream).sum().backward()
    got_grad = hidden.grad.clone()
    hidden.grad = None
    logp = torch.log_softmax((hidden @ weight.T).float(), dim=-1)
    want_entropy = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(stats.entropies, want_entropy.detach(), rtol=1e-5, atol=1e-5)
    assert not stats.entropies.requires_grad
    expected, _ = _reference(hidden, weight, targets)
    (expected * upstream).sum().backward()
    scale = float(hidden.grad.abs().max())
    torch.testing.assert_close(got_grad, hidden.grad, rtol=1e-5, atol=1e-5 * scale)
    assert linear_token_logprobs(hidden, weight, targets).entropies is None
