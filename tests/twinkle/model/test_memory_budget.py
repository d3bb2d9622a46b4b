"""A model's memory budget (``ExecutionOptions.memory_budget_mb``).

- a batch whose one pass would not fit runs as row chunks, with the whole pass's gradients, even
  where the options keep batches whole; one that fits still runs whole;
- the limit a pass may take is the budget less what the process holds, never above the device's;
- eager attention's sequence-squared probabilities are in the memory model, sdpa's are not;
- a row that cannot fit the budget is refused before any work.
"""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.memory import release_above, resident_bytes
from twinkle.model.options import ExecutionOptions
from twinkle.model.step import fused as fused_module
from twinkle.model.step.passes import linear_head
from twinkle.model.step.plan import ModelShape, head_chunk_bytes, memory_in_use, memory_limit_bytes

ROWS, SEQ = 12, 40


def _model(**options):
    torch.manual_seed(0)
    m = MultiLoraTransformersModel("tiny://qwen3", options={"max_pass_tokens": 64, **options})
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules="all-linear")
    m.add_adapter_to_model("a", config)
    m.set_optimizer("AdamW", lr=1e-2)
    return m


def _passes(m):
    seen = []
    m.model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return seen


def _row_bytes(m, rows):
    """What ``rows`` rows take in the fused step's own accounting (the head's chunk included)."""
    shape = ModelShape.of(m.model)
    logits_free = linear_head(m.model) is not None
    fixed = head_chunk_bytes(m.options.linear_chunk_bytes, shape.dtype_bytes) if logits_free else 0
    return fixed + shape.pass_bytes(rows, SEQ, logits_free=logits_free, recompute=True)


def test_a_batch_over_the_memory_limit_runs_as_row_chunks_with_the_same_gradients(monkeypatch):
    batch = make_batch(rows=ROWS, seq=SEQ, seed=5)
    whole = _model()
    seen_whole = _passes(whole)
    out_whole = whole.forward_backward(inputs=batch)
    assert seen_whole == [(ROWS, SEQ)]  # fits: one pass, whole (split_batches is off)

    chunked = _model()
    seen = _passes(chunked)
    # Room for a few rows, not for the batch.
    limit = _row_bytes(chunked, 3)
    monkeypatch.setattr(fused_module, "memory_limit_bytes", lambda *_: limit)
    out = chunked.forward_backward(inputs=batch)
    assert len(seen) > 2 and all(rows < ROWS for rows, _ in seen)
    assert sum(rows for rows, _ in seen) == 2 * ROWS  # a no-grad and a grad pass per chunk
    assert out["loss"] == pytest.approx(out_whole["loss"], rel=1e-5)
    for p, q in zip(chunked.tenants["a"].params, whole.tenants["a"].params):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_a_row_over_the_budget_is_refused_before_any_work(monkeypatch):
    m = _model()
    seen = _passes(m)
    monkeypatch.setattr(fused_module, "memory_limit_bytes", lambda *_: 1 << 10)
    m.options = m.options.replace(memory_budget_mb=900)
    with pytest.raises(InvalidArgumentError, match="a row of 40 tokens needs about") as info:
        m.forward_backward(inputs=make_batch(rows=ROWS, seq=SEQ, seed=5))
    assert "within its memory_budget_mb=900" in str(info.value)
    assert seen == [] and not m.tenants["a"].pending_grads


def test_the_limit_is_the_budget_less_what_the_process_holds():
    cpu = torch.device("cpu")
    held = memory_in_use(cpu)
    assert 0 < held <= resident_bytes()
    free = memory_limit_bytes(cpu)
    budget_mb = (held >> 20) + 64
    limit = memory_limit_bytes(cpu, budget_mb)
    assert limit <= min(free, (budget_mb << 20) - memory_in_use(cpu) + (8 << 20))
    assert limit >= (32 << 20)  # about 64 MiB left, less what moved since
    assert memory_limit_bytes(cpu, 1) == 0  # a budget below what is held leaves nothing
    assert memory_limit_bytes(cpu, 1 << 30) == pytest.approx(free, rel=0.05)


def test_eager_attention_is_counted_sequence_squared_and_sdpa_is_not():
    eager = MultiLoraTransformersModel("tiny://qwen3", attn_implementation="eager")
    sdpa = MultiLoraTransformersModel("tiny://qwen3")
    e, s = ModelShape.of(eager.model), ModelShape.of(sdpa.model)
    assert (e.quadratic_heads, s.quadratic_heads) == (4, 0)
    kw = dict(logits_free=False, recompute=False)
    per_token = s.bytes_per_token(**kw)
    assert s.pass_bytes(2, 1000, **kw) == 2 * 1000 * per_token
    # 2 rows x 4 heads x 1000^2 x 4 bytes x 2 (values and gradient) x 2 layers
    assert e.pass_bytes(2, 1000, **kw) - 2 * 1000 * per_token == 2 * 4 * 1000**2 * 4 * 2 * 2
    # with recompute one layer at a time keeps them
    assert (
        e.pass_bytes(2, 1000, logits_free=False, recompute=True)
        - s.pass_bytes(2, 1000, logits_free=False, recompute=True)
        == 2 * 4 * 1000**2 * 4 * 2
    )


def test_freed_memory_kept_above_the_budget_goes_back():
    MultiLoraTransformersModel("tiny://qwen3")  # its constructor keeps freed memory (glibc)
    assert release_above(None) is False
    assert release_above(1 << 30) is False  # far below the budget
    assert release_above(1) is True


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_memory_budget_is_validated(bad):
    with pytest.raises(ValueError, match="memory_budget_mb must be an integer >= 1"):
        ExecutionOptions(memory_budget_mb=bad)
