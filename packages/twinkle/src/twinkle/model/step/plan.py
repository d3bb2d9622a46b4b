"""How many passes a fused step takes: tenants' batches grouped by a token budget.

One pass over every waiting tenant's rows holds all their activations at once (peak memory grows
with the tenants' combined rows, not with one tenant's). :func:`plan_passes` packs whole batches
into passes of at most ``max_tokens`` padded tokens (rows times the pass's longest sequence) in
the order given; a batch that alone exceeds the budget is cut into row chunks that each fit (see
``fused.py`` for how such a tenant's loss stays exact). :func:`pass_token_budget` is the budget
when ``ExecutionOptions.max_pass_tokens`` leaves it to the device.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from twinkle.model.step.batch import IMAGE_KEYS, TenantBatch

#: The CPU budget, as activation memory per pass: what one pass may hold beyond the model's
#: weights and the tenants' states, at the model's activation bytes per token
#: (:func:`activation_bytes_per_token`), so a larger model gets fewer tokens per pass. Memory per
#: token is the base model's, the same in a fused pass as in one tenant's own, so a pass's size is
#: a trade: each CPU pass also pays a fixed cost in the base model, and passes small enough to keep
#: the peak near a per-tenant loop's give up most of the fusion's gain. The value keeps passes of
#: eight 128-token rows on the ~25M benchmark model (measurements: docs/performance.md, "Memory
#: per pass").
CPU_PASS_ACTIVATION_BYTES = 600 << 20
#: A CPU pass holds at least two 128-token rows and at most 2048 tokens (beyond that, on the tiny
#: model, a wider pass bought little speed for much more peak memory).
CPU_MIN_TOKENS, CPU_MAX_TOKENS = 256, 2048
#: Share of the free device memory a GPU pass's activations may take.
GPU_FREE_FRACTION = 0.5
GPU_MIN_TOKENS, GPU_MAX_TOKENS = 2048, 1 << 20

_budgets: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[bool, bool], int]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of batch ``index``; ``whole`` when they are all its rows."""

    index: int
    start: int
    stop: int
    whole: bool


def plan_passes(
    batches: Sequence[TenantBatch], max_tokens: int | None, splittable: Sequence[bool]
) -> list[list[Piece]]:
    """Passes over ``batches``: each a list of pieces whose padded tokens fit ``max_tokens``
    (``None``: one pass). A batch over the budget that ``splittable[i]`` allows to be cut runs
    as row chunks, each a pass of its own; one that may not be cut runs whole, alone."""
    if max_tokens is None:
        return [[Piece(i, 0, b.num_samples, True) for i, b in enumerate(batches)]]
    passes: list[list[Piece]] = []
    current: list[Piece] = []
    rows = seq = 0
    for i, batch in enumerate(batches):
        b_rows, b_seq = batch.num_samples, batch.tensors["input_ids"].shape[1]
        if (rows + b_rows) * max(seq, b_seq) <= max_tokens:
            current.append(Piece(i, 0, b_rows, True))
            rows, seq = rows + b_rows, max(seq, b_seq)
            continue
        if current:
            passes.append(current)
            current, rows, seq = [], 0, 0
        if b_rows * b_seq <= max_tokens:
            current, rows, seq = [Piece(i, 0, b_rows, True)], b_rows, b_seq
        elif splittable[i] and b_rows > 1:
            step = max(1, max_tokens // max(1, b_seq))
            for start in range(0, b_rows, step):
                passes.append([Piece(i, start, min(b_rows, start + step), False)])
        else:
            passes.append([Piece(i, 0, b_rows, True)])
    if current:
        passes.append(current)
    return passes


def can_split(batch: TenantBatch, lora_dropout: float) -> bool:
    """Whether ``batch``'s rows may run in separate passes: every tensor is per row
    (no image inputs, which are packed over images, not rows) and the adapter draws no dropout
    (a second pass over the same rows must give the same function)."""
    if lora_dropout > 0 or any(k in batch.tensors for k in IMAGE_KEYS):
        return False
    if batch.task == "embedding":  # the split backward reruns log-probs, not embeddings
        return False
    rows = batch.num_samples
    tensors = [*batch.tensors.values(), *(v for v in batch.extras.values() if v is not None)]
    # [rows] or [rows, seq] only: a [3, rows, seq] multimodal position_ids is not cut.
    return all(t.dim() in (1, 2) and t.shape[0] == rows for t in tensors)


def rows_of(batch: TenantBatch, start: int, stop: int) -> TenantBatch:
    """Rows ``[start, stop)`` of ``batch`` (same sequence length), for a chunk's pass."""
    return TenantBatch(
        tenant=batch.tenant,
        tensors={k: v[start:stop] for k, v in batch.tensors.items()},
        targets=batch.targets[start:stop],
        mask=batch.mask[start:stop],
        extras={k: (None if v is None else v[start:stop]) for k, v in batch.extras.items()},
        alignment=batch.alignment,
        num_samples=stop - start,
        loss_kwargs=batch.loss_kwargs,
        loss=batch.loss,
        task=batch.task,
        row_labels=None if batch.row_labels is None else batch.row_labels[start:stop],
    )


def pass_token_budget(
    configured: int | None,
    base_model: torch.nn.Module,
    device: torch.device,
    *,
    logits_free: bool = False,
    recompute: bool = False,
) -> int | None:
    """``configured`` (``ExecutionOptions.max_pass_tokens``), else the device's default: the
    tokens whose activations (:func:`activation_bytes_per_token`, for the head and recompute
    settings given) fit :data:`CPU_PASS_ACTIVATION_BYTES` on a CPU, or :data:`GPU_FREE_FRACTION`
    of the memory free at the first step on a GPU (computed once per model and setting). ``None``
    when ``configured`` is 0 (no limit)."""
    if configured is not None:
        return configured or None
    budgets = _budgets.setdefault(base_model, {})
    key = (logits_free, recompute)
    budget = budgets.get(key)
    if budget is None:
        per_token = activation_bytes_per_token(
            base_model, logits_free=logits_free, recompute=recompute
        )
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            budget = int(free * GPU_FREE_FRACTION // per_token)
            budget = min(GPU_MAX_TOKENS, max(GPU_MIN_TOKENS, budget))
        else:
            budget = CPU_PASS_ACTIVATION_BYTES // per_token
            budget = min(CPU_MAX_TOKENS, max(CPU_MIN_TOKENS, budget))
        budgets[key] = budget
    return budget


#: Values per token and layer a decoder layer keeps for its backward, in the weights' dtype
#: (Korthikanti et al., 2022, without recompute and without the attention matrix, which the
#: fused attention kernels do not keep).
LAYER_VALUES = 34


@dataclass(frozen=True)
class ModelShape:
    """What the activation memory model reads of a model: its text config and weight dtype."""

    hidden: int
    layers: int
    vocab: int
    dtype_bytes: int
    #: Attention heads of a layer whose attention keeps its ``[heads, seq, seq]`` probabilities
    #: for the backward (``eager``); 0 for the fused kernels (``sdpa``, flash), which do not.
    quadratic_heads: int = 0

    @classmethod
    def of(cls, base_model: torch.nn.Module) -> ModelShape:
        config = getattr(base_model, "config", None)
        text = getattr(config, "text_config", None) or config
        eager = getattr(config, "_attn_implementation", None) == "eager"
        return cls(
            hidden=int(getattr(text, "hidden_size", 1024)),
            layers=int(getattr(text, "num_hidden_layers", 24)),
            vocab=int(getattr(text, "vocab_size", 32000)),
            dtype_bytes=next(base_model.parameters()).element_size(),
            quadratic_heads=int(getattr(text, "num_attention_heads", 0) or 0) if eager else 0,
        )

    def pass_bytes(self, rows: int, seq: int, *, logits_free: bool, recompute: bool) -> int:
        """Activation bytes of a pass over ``rows`` rows of ``seq`` padded tokens: the linear
        term (:meth:`bytes_per_token`) plus, for an attention that keeps its probabilities,
        their ``rows x heads x seq x seq`` values and gradient in every layer (one layer at a
        time with recompute)."""
        linear = rows * seq * self.bytes_per_token(logits_free=logits_free, recompute=recompute)
        if not self.quadratic_heads:
            return linear
        kept_layers = 1 if recompute else self.layers
        return linear + 2 * rows * self.quadratic_heads * seq * seq * self.dtype_bytes * kept_layers

    def bytes_per_token(self, *, logits_free: bool, recompute: bool) -> int:
        """Activation bytes a training pass keeps per token.

        - decoder layers: :data:`LAYER_VALUES` x hidden per layer; with recompute each layer
          keeps its input (hidden values) and one layer at a time holds all of its own;
        - the head: the fp32 logits, their log-softmax and gradient (3 x 4 x vocab bytes), or,
          logits-free, the last hidden state and one fp32 expected head row (the tile of logits
          is a fixed cost, :func:`head_chunk_bytes`).
        """
        layer = LAYER_VALUES * self.hidden * self.dtype_bytes
        if recompute:
            body = self.layers * self.hidden * self.dtype_bytes + layer
        else:
            body = self.layers * layer
        head = (self.dtype_bytes + 4) * self.hidden if logits_free else 3 * 4 * self.vocab
        return body + head


def activation_bytes_per_token(
    base_model: torch.nn.Module, *, logits_free: bool = False, recompute: bool = False
) -> int:
    """Bytes a training pass keeps per token (:meth:`ModelShape.bytes_per_token`)."""
    return ModelShape.of(base_model).bytes_per_token(logits_free=logits_free, recompute=recompute)


def head_chunk_bytes(chunk_bytes: int, dtype_bytes: int) -> int:
    """Peak bytes of one logits-free tile: its fp32 logits and, below fp32, their copy in the
    head's dtype for the expected-row product."""
    return chunk_bytes + (chunk_bytes * dtype_bytes // 4 if dtype_bytes < 4 else 0)


def memory_limit_bytes(device: torch.device, budget_mb: int | None = None) -> int:
    """What one pass's activations can take at most: the free memory of a GPU, or the memory
    the operating system reports available (``MemAvailable``) on a CPU; with a budget
    (``ExecutionOptions.memory_budget_mb``), no more than the budget less what the process
    holds now (:func:`memory_in_use`)."""
    free = _free_bytes(device)
    if budget_mb is None:
        return free
    return max(0, min(free, (budget_mb << 20) - memory_in_use(device)))


def memory_in_use(device: torch.device) -> int:
    """Bytes the process holds for its model now: torch's allocated memory on a GPU; on a CPU
    the resident set less the freed memory glibc keeps for reuse (a budget counts what the
    next pass cannot reuse)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    from twinkle.model.memory import heap_stats, resident_bytes

    stats = heap_stats()
    return max(0, resident_bytes() - (stats["free_kept"] if stats else 0))


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # Without /proc (macOS): the free physical pages, a lower bound of what is available.
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def refuse_unfit(
    batches: Sequence[TenantBatch],
    splittable: Sequence[bool],
    shape: ModelShape,
    limit_bytes: Callable[[], int],
    *,
    logits_free: bool,
    recompute: bool,
    fixed_bytes: int = 0,
    budget: int | None = None,
    budget_mb: int | None = None,
) -> None:
    """Refuse, before any work, a batch whose smallest pass cannot fit ``limit_bytes()``: one
    row when its rows may be cut into passes, else the whole batch. Units within ``budget``
    tokens (the pass budget, which fits by construction) are not checked, so an ordinary step
    never reads the memory figure. ``budget_mb``: the memory budget the limit comes from, named
    in the refusal.

    Raises:
        InvalidArgumentError: Naming the tenant, the tokens that do not fit, the tokens that
            would, and what to change.
    """
    from twinkle.errors import InvalidArgumentError

    per_token = shape.bytes_per_token(logits_free=logits_free, recompute=recompute)
    limit = fit = None
    for batch, split in zip(batches, splittable):
        rows, seq = batch.num_samples, batch.tensors["input_ids"].shape[1]
        tokens = seq if split else rows * seq
        if budget is not None and tokens <= budget:
            continue
        if limit is None:
            limit = limit_bytes()
            fit = max(0, (limit - fixed_bytes) // per_token)
        unit_rows = 1 if split else rows
        need = shape.pass_bytes(unit_rows, seq, logits_free=logits_free, recompute=recompute)
        if need + fixed_bytes <= limit:
            continue
        unit = f"a row of {seq} tokens" if split or rows == 1 else f"{rows} rows x {seq} tokens"
        advice = (
            "shorten the rows (e.g. the template's max_length)"
            if recompute
            else "turn on activation_recompute (execution block), or shorten the rows"
        )
        if not split and rows > 1:
            advice += ", or send fewer rows per request"
        need += fixed_bytes
        within = f" within its memory_budget_mb={budget_mb}" if budget_mb is not None else ""
        raise InvalidArgumentError(
            f"adapter {batch.tenant!r}: {unit} needs about {_size(need)} of activations"
            f"{' with activation recompute' if recompute else ''}, but this replica has "
            f"{_size(limit)} free{within}: at most {fit} tokens fit in one pass; {advice}. "
            "Nothing was run."
        )


def split_to_fit(
    batches: Sequence[TenantBatch],
    splittable: Sequence[bool],
    cuttable: Sequence[bool],
    shape: ModelShape,
    limit_bytes: Callable[[], int],
    *,
    logits_free: bool,
    recompute: bool,
    fixed_bytes: int = 0,
    budget: int | None = None,
) -> list[bool]:
    """``splittable``, plus each batch whose rows may be cut (``cuttable``) and whose whole
    pass would not fit ``limit_bytes()``: memory decides there, not the choice to keep batches
    whole (``ExecutionOptions.split_batches``), since a pass that does not fit cannot run at
    all. Batches within ``budget`` tokens are not checked (they fit by construction)."""
    result = list(splittable)
    limit = None
    for i, batch in enumerate(batches):
        rows, seq = batch.num_samples, batch.tensors["input_ids"].shape[1]
        if result[i] or not cuttable[i] or rows < 2:
            continue
        if budget is not None and rows * seq <= budget:
            continue
        if limit is None:
            limit = limit_bytes()
        need = shape.pass_bytes(rows, seq, logits_free=logits_free, recompute=recompute)
        result[i] = need + fixed_bytes > limit
    return result


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


__all__ = [
    "CPU_PASS_ACTIVATION_BYTES",
    "LAYER_VALUES",
    "ModelShape",
    "head_chunk_bytes",
    "memory_limit_bytes",
    "memory_in_use",
    "refuse_unfit",
    "split_to_fit",
    "Piece",
    "activation_bytes_per_token",
    "can_split",
    "pass_token_budget",
    "plan_passes",
    "rows_of",
]
