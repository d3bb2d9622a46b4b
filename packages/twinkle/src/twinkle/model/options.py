"""How a model executes its passes: the one object that holds every performance knob.

A model takes an :class:`ExecutionOptions` at construction and keeps it; nothing on the hot path
reads a module global or an environment variable. Environment variables only supply defaults, once,
in :meth:`ExecutionOptions.from_env`. The server builds the object from the ``execution:`` block of
a model or sampler application (see docs/server_config.md), whose fields are derived from these. None of these knobs changes results
beyond floating-point summation order: they choose between equivalent implementations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from twinkle.env import TWINKLE_LORA_KERNEL, TWINKLE_MALLOC_TUNING

LoraKernel = Literal["auto", "torch", "triton"]
_KERNELS = ("auto", "torch", "triton")
Recompute = Literal["off", "auto", "on"]
_RECOMPUTE = ("off", "auto", "on")


@dataclass(frozen=True)
class ExecutionOptions:
    """Execution choices of one model.

    Attributes:
        lora_kernel: The multi-LoRA op's implementation. ``auto``: the Triton kernels for CUDA
            tensors when triton imports, else torch; ``torch`` forces the torch path; ``triton``
            asks for Triton on CUDA (CPU tensors always take the torch path).
        direct_weight_grads: The fused step's LoRA layers add their weight gradients straight into
            each tenant's flat gradient buffer instead of through autograd's accumulation (same
            values; off only to measure or to debug).
        small_gemm_one_thread: Run small CPU work (optimizer steps, gradient norms over small
            tensors) on one intra-op thread, where the thread pool's fork/join costs more than the
            arithmetic.
        small_tensor_elements: Average tensor size, in elements, at or below which that rule
            applies.
        logprob_chunk_bytes: Size of one chunk of the log-softmax over the vocabulary on CPU
            (bounds the peak memory of per-token log-probabilities).
        fused_adam: Build Adam/AdamW with torch's fused kernel unless the caller asks otherwise.
        malloc_tuning: The process keeps the memory it frees for the next step (glibc
            ``mallopt``; see :mod:`twinkle.model.memory`): a server replica and a model built
            for local training alike (the model's constructor applies it).
        cpu_threads: torch intra-op threads for the process that owns the model (a server
            replica, or a local model's constructor sets them); ``None`` leaves torch's own
            choice.
        max_pass_tokens: Most padded tokens (rows x longest sequence) one fused training pass
            holds: waiting tenants' batches are packed into passes up to it and their gradients
            accumulate (bounds the step's activation memory). ``None``: the device's measured
            default (:func:`twinkle.model.step.plan.pass_token_budget`); ``0``: no limit, every
            tenant in one pass.
        split_batches: A single tenant's batch over ``max_pass_tokens`` runs as row chunks (one
            extra forward, the exact gradient) instead of whole in a pass of its own.
        lean_activations: Training passes keep fewer activations in the base model's SwiGLU
            MLPs (:mod:`twinkle.model.transformers.lean`; bit-identical gradients, no extra
            matrix work). Off only to measure.
        linear_logprobs: Token log-probs come from the last hidden states and the LM head in
            tiles (:mod:`twinkle.model.step.linear_logprobs`), never as the
            ``[tokens, vocab]`` logits, where the head is a plain linear layer (same values).
            Off only to measure, or for a head the check does not recognise.
        linear_chunk_bytes: fp32 logits one tile of that computation (a chunk of tokens by
            a slice of the vocabulary) holds at a time.
        activation_recompute: Training passes keep only each decoder layer's input and run
            the layer again in the backward (:mod:`twinkle.model.transformers.recompute`; same
            results, about a third more compute). ``auto``: only for a pass that exceeds the
            pass budget without it (a batch or a row too long to share or cut); ``on``: every
            training pass; ``off``: never (a row too long for memory without it is refused).
        memory_budget_mb: The most memory, in MiB, this process's model may hold: weights,
            tenants' states and a pass's activations together. A batch whose pass would go
            beyond it runs as row chunks where its rows may be cut, else is refused before any
            work (:mod:`twinkle.model.step.plan`); after a step, freed memory the process keeps
            above it goes back to the operating system. ``None``: what the device has (a GPU's
            free memory; on a CPU, what the operating system reports available).
    """

    # ``metadata``: the bounds of a number (pydantic's ``ge``), which the server's YAML block
    # (derived from these fields) checks as it parses.
    lora_kernel: LoraKernel = "auto"
    direct_weight_grads: bool = True
    small_gemm_one_thread: bool = True
    small_tensor_elements: int = field(default=32768, metadata={"ge": 1})
    logprob_chunk_bytes: int = field(default=2 << 20, metadata={"ge": 1})
    fused_adam: bool = True
    malloc_tuning: bool = True
    cpu_threads: int | None = field(default=None, metadata={"ge": 1})
    max_pass_tokens: int | None = field(default=None, metadata={"ge": 0})
    split_batches: bool = False
    lean_activations: bool = True
    linear_logprobs: bool = True
    linear_chunk_bytes: int = field(default=32 << 20, metadata={"ge": 1})
    activation_recompute: Recompute = "auto"
    memory_budget_mb: int | None = field(default=None, metadata={"ge": 1})

    def __post_init__(self) -> None:
        if self.lora_kernel not in _KERNELS:
            raise ValueError(
                f"lora_kernel must be one of {', '.join(_KERNELS)}, got {self.lora_kernel!r}"
            )
        if self.activation_recompute not in _RECOMPUTE:
            raise ValueError(
                f"activation_recompute must be one of {', '.join(_RECOMPUTE)}, "
                f"got {self.activation_recompute!r}"
            )
        for name in ("small_tensor_elements", "logprob_chunk_bytes", "linear_chunk_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.cpu_threads is not None and (
            not isinstance(self.cpu_threads, int) or self.cpu_threads < 1
        ):
            raise ValueError(f"cpu_threads must be an integer >= 1, got {self.cpu_threads!r}")
        value = self.max_pass_tokens
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise ValueError(f"max_pass_tokens must be an integer >= 0 or null, got {value!r}")
        value = self.memory_budget_mb
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"memory_budget_mb must be an integer >= 1 or null, got {value!r}")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> ExecutionOptions:
        """Defaults from the environment (read once, here), then ``overrides``.

        ``TWINKLE_LORA_KERNEL`` (``auto | torch | triton``) and ``TWINKLE_MALLOC_TUNING=0`` are
        the two variables earlier releases read on every call; they keep working as defaults.
        """
        values: dict[str, Any] = {}
        kernel = (TWINKLE_LORA_KERNEL.get(environ) or "").strip().lower()
        if kernel:
            values["lora_kernel"] = kernel
        if not TWINKLE_MALLOC_TUNING.get(environ):
            values["malloc_tuning"] = False
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> ExecutionOptions:
        """A copy with ``changes`` applied (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_options(options: ExecutionOptions | Mapping[str, Any] | None) -> ExecutionOptions:
    """What a model constructor accepts: an :class:`ExecutionOptions`, a mapping of its fields
    (as the server's YAML gives it), or ``None`` for the environment's defaults."""
    if options is None:
        return ExecutionOptions.from_env()
    if isinstance(options, ExecutionOptions):
        return options
    if isinstance(options, Mapping):
        known = {f.name for f in dataclasses.fields(ExecutionOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown execution option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return ExecutionOptions.from_env(**dict(options))
    raise TypeError(f"options must be ExecutionOptions or a mapping, got {type(options).__name__}")


__all__ = ["ExecutionOptions", "LoraKernel", "Recompute", "resolve_options"]
