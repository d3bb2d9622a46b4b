"""Each loss's data-parallel rule: scaled shard gradients add up to the combined batch's gradient."""

import pytest
import torch

from twinkle.loss import LossInputs, get_loss
from twinkle.parallel import _normalisation as norm

LOSSES = [
    ("CrossEntropyLoss", {}),
    ("CrossEntropyLoss", {"reduction": "sum"}),
    ("GRPOLoss", {"loss_type": "grpo"}),
    ("GRPOLoss", {"loss_type": "bnpo"}),
    ("GRPOLoss", {"loss_type": "dr_grpo"}),
    ("DPOLoss", {}),
    ("importance_sampling", {}),
    ("ppo", {}),
]


def _batch(rows: int, seq: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, seq, generator=g) > 0.3).float()
    return {
        "logprobs": -torch.rand(rows, seq, generator=g) * 5,
        "mask": mask,
        "advantages": torch.randn(rows, generator=g),
        "old_logprobs": -torch.rand(rows, seq, generator=g) * 5,
        "ref_logprobs": -torch.rand(rows, seq, generator=g) * 5,
        "weights": torch.rand(rows, seq, generator=g) * mask,
    }


def _grad(loss, batch, seq: int):
    """Gradient of ``loss`` w.r.t. the (padded to ``seq``) log-probs, and the shard's stats."""
    padded = {
        k: torch.nn.functional.pad(v, (0, seq - v.shape[1])) if v.dim() == 2 else v
        for k, v in batch.items()
    }
    logprobs = padded.pop("logprobs").clone().requires_grad_(True)
    inputs = LossInputs(
        logprobs=logprobs, target_tokens=torch.zeros_like(logprobs, dtype=torch.long), **padded
    )
    loss(inputs).loss.backward()
    return logprobs.grad, norm.shard_stats(loss, inputs)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name,kwargs", LOSSES)
def test_scaled_shard_gradients_equal_the_combined_batch(name, kwargs, weighted):
    loss = get_loss(name, **kwargs)
    full = _batch(rows=6, seq=12, seed=0)
    if not weighted:
        full.pop("weights")
    expected, _ = _grad(loss, full, 12)
    # shard 0 has 4 rows trimmed to 9 columns (its own padding), shard 1 has 2 rows, 12 columns
    full["mask"][:4, 9:] = 0
    expected, _ = _grad(loss, full, 12)
    shards = [
        ({k: v[:4, :9] if v.dim() == 2 else v[:4] for k, v in full.items()}, 9),
        ({k: v[4:] for k, v in full.items()}, 12),
    ]
    grads, stats = zip(*(_grad(loss, batch, seq) for batch, seq in shards))
    kind = norm.normaliser_kind(loss)
    total = norm.global_norm(
        kind, sum(s.norm for s in stats), sum(s.rows for s in stats), max(s.seq for s in stats)
    )
    combined = torch.zeros(6, 12)
    combined[:4, :9] = grads[0][:, :9] * norm.scale(kind, stats[0], total)
    combined[4:] = grads[1] * norm.scale(kind, stats[1], total)
    torch.testing.assert_close(combined, expected, rtol=1e-5, atol=1e-7)


def test_a_rank_without_rows_contributes_nothing():
    assert norm.scale(norm.TOKENS, norm.ShardStats(), 10.0) == 0.0
    assert norm.scale(norm.SUM, norm.ShardStats(), 1.0) == 0.0
