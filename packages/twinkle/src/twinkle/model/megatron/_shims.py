"""The one CPU shim every megatron module needs during a pass (its own module, so that the model
builder and the MoE mapping can both use it without importing each other)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def cpu_shims(device: torch.device):
    """While megatron runs on CPU, ``torch.cuda.current_device()`` answers ``'cpu'`` (its RoPE
    moves tensors there); restored on exit. A no-op on CUDA devices."""
    if device.type != "cpu":
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]
