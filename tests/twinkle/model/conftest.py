import pytest
import torch


def make_batch(
    rows: int = 4, seq: int = 24, seed: int = 0, vocab: int = 4000
) -> dict[str, torch.Tensor]:
    """A collated batch of random tokens; the first 4 positions are prompt (not trained)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@pytest.fixture
def batch():
    return make_batch()
