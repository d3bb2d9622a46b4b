"""One tenant's adapter in the mock model: weights, gradients, optimizer and settings."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora_fields import check_init, check_lora_fields, config_values
from twinkle.model.mock._optim import LRSchedule, NumpyOptimizer
from twinkle_client.tracking.history import TrainingHistoryRecorder

SUPPORTED_LOSSES = ("CrossEntropyLoss", "cross_entropy", "importance_sampling")


def read_lora_config(config: Any, name: str = "adapter") -> tuple[int, float, bool]:
    """Read ``(r, lora_alpha, use_rslora)`` from a peft LoraConfig, a dict, any object with
    those attributes or a PEFT adapter directory; peft's defaults (r=8, lora_alpha=8) fill what is missing.

    The mock refuses the LoraConfig fields every backend refuses
    (:func:`twinkle.model.lora_fields.check_lora_fields`); of the honoured ones it models rank,
    alpha and rsLoRA scaling (its one adapted layer has no names to select or pattern-match:
    ``target_modules`` and ``target_parameters`` select nothing there).
    """
    values: dict[str, Any] = {} if config is None else config_values(config)
    check_lora_fields(values, name)
    check_init(values.get("init_lora_weights", True), name)
    rank, alpha = values.get("r", 8), values.get("lora_alpha", 8)
    if int(rank) <= 0:
        raise InvalidArgumentError(f"LoRA rank must be positive, got {rank!r}")
    return int(rank), float(alpha), bool(values.get("use_rslora", False))


@dataclass
class MetricResult:
    """The result of ``calculate_metric``; ``result`` holds loss, token_acc, grad_norm, lr, step."""

    result: dict[str, Any]


@dataclass
class MetricTotals:
    """Running sums between two ``calculate_metric`` calls."""

    loss_sum: float = 0.0
    calls: int = 0
    correct: int = 0
    tokens: int = 0

    def add(self, loss: float, correct: int, tokens: int) -> None:
        """Record one forward pass."""
        self.loss_sum += loss
        self.calls += 1
        self.correct += correct
        self.tokens += tokens


def _name_of(spec: Any) -> str:
    return spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)


@dataclass
class AdapterState:
    """Everything that belongs to one tenant; nothing here is shared with another adapter."""

    name: str
    rank: int
    alpha: float
    params: dict[str, np.ndarray]
    gradient_accumulation_steps: int = 1
    use_rslora: bool = False
    grads: dict[str, np.ndarray] = field(default_factory=dict)
    micro_steps: int = 0
    cur_step: int = 0
    loss_name: str = "CrossEntropyLoss"
    loss_kwargs: dict = field(default_factory=dict)
    optimizer: NumpyOptimizer | None = None
    schedule: LRSchedule = field(default_factory=LRSchedule)
    template: str | None = None
    processor: str | None = None
    last_grad_norm: float | None = None
    pending_grads: bool = False
    train_totals: MetricTotals = field(default_factory=MetricTotals)
    eval_totals: MetricTotals = field(default_factory=MetricTotals)
    history: TrainingHistoryRecorder = field(default_factory=TrainingHistoryRecorder)
    #: The owner's name for the adapter where ``name`` is a key the owner never reads (a
    #: server's internal id): what messages show (as ``twinkle.model.tenant.Tenant``).
    display_name: str | None = None

    @property
    def label(self) -> str:
        return self.display_name or self.name

    @classmethod
    def create(cls, name: str, config: Any, hidden_size: int, seed: int, accum: int):
        """Build a fresh adapter: ``A`` random, ``B`` zero, so it starts as the identity.

        The init seed mixes in the adapter name, so an adapter's start does not depend on which
        other tenants were added before it.
        """
        if accum < 1:
            raise InvalidArgumentError(f"gradient_accumulation_steps must be >= 1, got {accum}")
        rank, alpha, use_rslora = read_lora_config(config, name)
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        params = {
            "A": rng.standard_normal((hidden_size, rank)) / np.sqrt(hidden_size),
            "B": np.zeros((rank, hidden_size)),
        }
        state = cls(
            name, rank, alpha, params, gradient_accumulation_steps=accum, use_rslora=use_rslora
        )
        state.zero_grad()
        return state

    @property
    def scale(self) -> float:
        """LoRA scaling ``alpha / r`` (``alpha / sqrt(r)`` with rsLoRA)."""
        return self.alpha / (np.sqrt(self.rank) if self.use_rslora else self.rank)

    def zero_grad(self) -> None:
        """Reset the accumulated gradients."""
        self.grads = {key: np.zeros_like(value) for key, value in self.params.items()}
        self.pending_grads = False

    def set_loss(self, name: str, **kwargs) -> None:
        """Select the loss by name (the mock implements cross entropy and importance sampling)."""
        name = _name_of(name)
        if name not in SUPPORTED_LOSSES:
            raise InvalidArgumentError(
                f"the mock model supports the losses {SUPPORTED_LOSSES}, got {name!r}"
            )
        self.loss_name, self.loss_kwargs = name, dict(kwargs)

    def set_template(self, template: Any) -> None:
        """Remember the template (by name; the mock consumes token ids directly)."""
        self.template = _name_of(template)

    def set_processor(self, processor: Any) -> None:
        """Remember the processor (by name; the mock consumes token ids directly)."""
        self.processor = _name_of(processor)

    def current_lr(self) -> float:
        """The learning rate the next optimizer step will use (0 when no optimizer is set)."""
        if self.optimizer is None:
            return 0.0
        return self.schedule.lr_at(self.optimizer.lr, self.cur_step)
