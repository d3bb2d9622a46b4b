"""Logits-free token log-probs at a real vocabulary size (Qwen3's 151,936): the tiled function
equals the materialised logits -> log-softmax path in values and gradients, for any tile size
(token chunks, vocabulary slices with the running maximum moving between them, both)."""

import pytest
import torch

from twinkle.model.step.linear_logprobs import (
    MIN_TILE_COLUMNS,
    LoraHeadRows,
    Tiles,
    linear_token_logprobs,
)

QWEN3_VOCAB = 151_936


def _reference(hidden, weight, targets):
    logits = (hidden @ weight.T).float()
    logprobs = torch.log_softmax(logits, dim=-1)
    valid = targets != -100
    picked = logprobs.gather(-1, torch.where(valid, targets, 0)[..., None]).squeeze(-1)
    hits = valid & (logits.argmax(-1) == torch.where(valid, targets, 0))
    return torch.where(valid, picked, 0.0), hits


# 7-token chunks of the whole vocabulary; one tile; 3-token chunks of 4,096-column slices.
@pytest.mark.parametrize("chunk_bytes", [4 * QWEN3_VOCAB * 7, 64 << 20, 4 * MIN_TILE_COLUMNS * 3])
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


def test_tiles_span_many_tokens_and_a_slice_of_the_vocabulary():
    # All of a 1,024-token pass against 8,192 columns at a time, rather than 55 tokens against
    # the whole head; a 16,384-token row takes 2,048-token chunks of the narrowest slice.
    assert Tiles.of(1024, QWEN3_VOCAB, 32 << 20) == Tiles(rows=1024, columns=8192)
    assert Tiles.of(16384, QWEN3_VOCAB, 32 << 20) == Tiles(rows=2048, columns=MIN_TILE_COLUMNS)
    assert Tiles.of(8, 1000, 32 << 20) == Tiles(rows=8, columns=1000)
    assert Tiles.of(4, QWEN3_VOCAB, 1) == Tiles(rows=1, columns=MIN_TILE_COLUMNS)


def _lora_reference(hidden, u, weight, lora_B, targets):
    logits = (hidden @ weight.T).float() + u.float() @ lora_B.T.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    picked = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return torch.where(targets != -100, picked, 0.0), entropy


@pytest.mark.parametrize("trainable_head", [False, True])
def test_an_adapter_on_the_head_in_tiles_equals_the_materialised_logits(trainable_head):
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 10, 16, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(QWEN3_VOCAB, 16, generator=g)).requires_grad_(trainable_head)
    u = torch.randn(2, 10, 4, generator=g, requires_grad=True)
    lora_B = (0.1 * torch.randn(QWEN3_VOCAB, 4, generator=g)).requires_grad_()
    targets = torch.randint(0, QWEN3_VOCAB, (2, 10), generator=g)
    # Targets on both sides of a slice boundary and in the last, narrower slice; one ignored.
    targets[0, :4] = torch.tensor([MIN_TILE_COLUMNS - 1, MIN_TILE_COLUMNS, QWEN3_VOCAB - 1, -100])
    targets[1, 2] = QWEN3_VOCAB - 7
    # A logit far above the rest late in the vocabulary: the running maximum moves there.
    with torch.no_grad():
        weight[QWEN3_VOCAB - 7] = 4 * hidden[1, 2].detach() / hidden[1, 2].detach().norm()
    upstream = torch.randn(2, 10, generator=g)
    # Rows 1..2 carry the adapter, row 0 goes through the plain head.
    seg = LoraHeadRows(1, 2, u[1:2], lora_B)
    stats = linear_token_logprobs(
        hidden, weight, targets, chunk_bytes=4 * MIN_TILE_COLUMNS * 3, entropies=True, lora=[seg]
    )
    (stats.logprobs * upstream).sum().backward()
    leaves = [hidden, u, lora_B] + ([weight] if trainable_head else [])
    got_grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    plain, plain_entropy = _lora_reference(
        hidden[:1], torch.zeros(1, 10, 4), weight, torch.zeros_like(lora_B), targets[:1]
    )
    adapted, adapted_entropy = _lora_reference(hidden[1:], u[1:], weight, lora_B, targets[1:])
    want = torch.cat([plain, adapted])
    (want * upstream).sum().backward()

    torch.testing.assert_close(stats.logprobs, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        stats.entropies, torch.cat([plain_entropy, adapted_entropy]).detach(), rtol=1e-5, atol=1e-5
    )
    assert bool(stats.hits[1, 2]) and int(stats.hits.sum()) == 1
    for got, t in zip(got_grads, leaves):
        scale = float(t.grad.abs().max())
        torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5 * scale)
