"""``token_logprobs`` on the CPU runs the cross-entropy in chunks; values and gradients must not
depend on the chunking."""

import pytest
import torch

from twinkle.model.step import tensors as tensors_mod
from twinkle.model.step.tensors import IGNORE_INDEX, token_logprobs


def _inputs(rows=3, seq=37, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, seq, vocab, generator=g) * 3
    targets = torch.randint(0, vocab, (rows, seq), generator=g)
    targets[0, :5] = IGNORE_INDEX
    targets[2, -7:] = IGNORE_INDEX
    return logits, targets


def _expected(logits, targets):
    logp = torch.log_softmax(logits.double(), dim=-1)
    safe = targets.clamp(min=0)
    out = logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return torch.where(targets == IGNORE_INDEX, torch.zeros_like(out), out)


@pytest.mark.parametrize("chunk_tokens", [16, 17, 40, 10_000])
def test_chunked_logprobs_equal_the_whole_batch(monkeypatch, chunk_tokens):
    vocab = 50
    # chunk = CPU_CHUNK_BYTES // (4 * vocab) tokens; MIN_CHUNK_TOKENS keeps tiny values legal.
    monkeypatch.setattr(tensors_mod, "MIN_CHUNK_TOKENS", 1)
    monkeypatch.setattr(tensors_mod, "CPU_CHUNK_BYTES", chunk_tokens * 4 * vocab)
    logits, targets = _inputs(vocab=vocab)
    leaf = logits.clone().requires_grad_()
    out = token_logprobs(leaf, targets)
    assert out.shape == targets.shape
    torch.testing.assert_close(out.double(), _expected(logits, targets), rtol=1e-6, atol=1e-6)
    assert torch.all(out[targets == IGNORE_INDEX] == 0)

    weights = torch.linspace(-1, 2, targets.numel()).reshape(targets.shape)
    (out * weights).sum().backward()
    ref_leaf = logits.clone().double().requires_grad_()
    (_expected(ref_leaf, targets) * weights.double()).sum().backward()
    torch.testing.assert_close(leaf.grad.double(), ref_leaf.grad, rtol=1e-6, atol=1e-7)


def test_chunk_size_follows_the_vocabulary(monkeypatch):
    """~2 MiB of fp32 logits per chunk, never fewer than MIN_CHUNK_TOKENS tokens."""
    calls = []
    real = tensors_mod._nll

    def spy(logits, targets):
        calls.append(logits.shape[0])
        return real(logits, targets)

    monkeypatch.setattr(tensors_mod, "_nll", spy)
    token_logprobs(torch.zeros(2, 300, 4096), torch.zeros(2, 300, dtype=torch.long))
    assert calls == [128, 128, 128, 128, 88]  # 2 MiB / (4 B x 4096) = 128 tokens
    calls.clear()
    token_logprobs(torch.zeros(1, 40, 200_000), torch.zeros(1, 40, dtype=torch.long))
    assert calls == [16, 16, 8]  # 2 MiB holds 2 tokens of a 200k vocab: the floor applies
    calls.clear()
    token_logprobs(torch.zeros(1, 100, 4096), torch.zeros(1, 100, dtype=torch.long))
    assert calls == [100]  # fits one chunk: one call
    calls.clear()
    meta = torch.device("meta")  # stands in for an accelerator: never chunked
    token_logprobs(
        torch.zeros(2, 300, 4096, device=meta), torch.zeros(2, 300, dtype=torch.long, device=meta)
    )
    assert calls == [600]
