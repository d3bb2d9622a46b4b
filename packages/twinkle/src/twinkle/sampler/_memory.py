"""What one decode batch of the torch sampler allocates, and how many rows fit a memory budget.

The sampler runs without autograd, so a layer's activations live one layer at a time; what grows
with the batch is the cache (keys and values of every layer for every token, prompt and
completion), the prefill's transient per-token values, the logits the caller keeps, and, for an
attention implementation that materialises its probabilities (``eager``), one layer's
``rows x heads x seq x seq`` scores. The figures are upper bounds: a linear-attention layer's
recurrent state is smaller than the key/value cache it is counted as.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle.errors import InvalidArgumentError

#: Values per prompt token a layer holds while it runs without autograd (the residual stream,
#: query/key/value/output projections, and the MLP's gate, up and activated values), in units of
#: hidden (``4``) and intermediate (``3``) size.
HIDDEN_VALUES = 4
INTERMEDIATE_VALUES = 3


@dataclass(frozen=True)
class DecodeShape:
    """What the sampler's memory model reads of a model's text config and weight dtype."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_dim: int
    dtype_bytes: int
    #: Attention heads of an implementation that materialises ``[heads, seq, seq]`` scores
    #: (``eager``); 0 for the fused kernels (``sdpa``, flash).
    quadratic_heads: int = 0

    @classmethod
    def of(cls, model: Any) -> DecodeShape:
        from twinkle.model.step.plan import ModelShape

        # The training memory model's reading (hidden, layers, vocab, dtype, eager heads), plus
        # what only decoding needs: the key/value width and the MLP's.
        base = ModelShape.of(model)
        config = getattr(model, "config", None)
        text = getattr(config, "text_config", None) or config
        heads = int(getattr(text, "num_attention_heads", 0) or 0) or 1
        head_dim = int(getattr(text, "head_dim", 0) or 0) or base.hidden // heads
        kv_heads = int(getattr(text, "num_key_value_heads", 0) or 0) or heads
        return cls(
            hidden=base.hidden,
            intermediate=int(getattr(text, "intermediate_size", 0) or 4 * base.hidden),
            layers=base.layers,
            vocab=base.vocab,
            kv_dim=kv_heads * head_dim,
            dtype_bytes=base.dtype_bytes,
            quadratic_heads=base.quadratic_heads,
        )

    def batch_bytes(
        self, rows: int, prompt_width: int, max_tokens: int, *, prompt_logits: bool
    ) -> int:
        """Peak bytes of decoding ``rows`` rows left-padded to ``prompt_width`` tokens for up to
        ``max_tokens`` new tokens; ``prompt_logits``: the prefill keeps ``[rows, width, vocab]``
        logits (prompt log-probs or scores through the materialised head)."""
        tokens = prompt_width + max_tokens
        cache = rows * tokens * self.layers * 2 * self.kv_dim * self.dtype_bytes
        layer = HIDDEN_VALUES * self.hidden + INTERMEDIATE_VALUES * self.intermediate
        prefill = rows * prompt_width * layer * self.dtype_bytes
        if self.quadratic_heads:
            prefill += 2 * rows * self.quadratic_heads * prompt_width**2 * self.dtype_bytes
        # Each step's last-position logits, their fp32 copy and log-softmax (and the prompt's
        # whole rows of them when kept).
        logit_bytes = self.dtype_bytes + 4 + 4
        logits = rows * (prompt_width if prompt_logits else 1) * self.vocab * logit_bytes
        return cache + prefill + logits


def fit_row_groups(
    shape: DecodeShape,
    lengths: list[int],
    max_tokens: int,
    limit_bytes: int,
    *,
    prompt_logits: bool,
    budget_mb: int | None,
    row_label: Any,
) -> list[range]:
    """Consecutive groups of rows (``lengths``: each row's prompt tokens, in decode order), each
    decoded as one batch within ``limit_bytes``. A row that does not fit alone is refused before
    any work (:class:`InvalidArgumentError`, naming ``row_label(i)``, the budget and the tokens
    that fit)."""
    groups: list[range] = []
    start, width = 0, 0
    for i, length in enumerate(lengths):
        if shape.batch_bytes(1, length, max_tokens, prompt_logits=prompt_logits) > limit_bytes:
            raise InvalidArgumentError(
                _refusal(
                    shape,
                    str(row_label(i)),
                    length,
                    max_tokens,
                    limit_bytes,
                    prompt_logits,
                    budget_mb,
                )
            )
        wider = max(width, length)
        rows = i - start + 1
        if rows > 1 and (
            shape.batch_bytes(rows, wider, max_tokens, prompt_logits=prompt_logits) > limit_bytes
        ):
            groups.append(range(start, i))
            start, wider = i, length
        width = wider
    if lengths:
        groups.append(range(start, len(lengths)))
    return groups


def _refusal(
    shape: DecodeShape,
    label: str,
    length: int,
    max_tokens: int,
    limit_bytes: int,
    prompt_logits: bool,
    budget_mb: int | None,
) -> str:
    need = shape.batch_bytes(1, length, max_tokens, prompt_logits=prompt_logits)
    # The most prompt + completion tokens one row can take within the limit, all as prompt
    # (the prefill's transient values make prompt tokens the dearer kind).
    lo, hi = 0, length + max_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if shape.batch_bytes(1, mid, 0, prompt_logits=prompt_logits) <= limit_bytes:
            lo = mid
        else:
            hi = mid - 1
    within = (
        f"the {_mib(limit_bytes)} left of this sampler's memory_budget_mb={budget_mb}"
        if budget_mb is not None
        else f"the {_mib(limit_bytes)} of memory available"
    )
    return (
        f"{label} needs about {_mib(need)} to sample ({length} prompt tokens + max_tokens="
        f"{max_tokens}), over {within}; about {lo} tokens of prompt and completion fit: shorten "
        "the prompt, lower max_tokens, or raise the sampler's execution.memory_budget_mb"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n < 10 << 20 else f"{n >> 20:,} MiB"
