"""Run small CPU work on one intra-op thread.

On a CPU, torch splits many kernels across its thread pool; for small tensors the pool's fork/join
costs more than the arithmetic. ``one_thread(True)`` drops to one thread for the block and restores the previous
count; it is cheap and affects only performance. A model applies the rule as its
``ExecutionOptions`` say (``small_gemm_one_thread``, ``small_tensor_elements``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Tensors at or below this many elements on average count as small (torch's elementwise grain).
SMALL_TENSOR_ELEMENTS = 32768


@contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """Use one intra-op thread inside the block when ``enabled``."""
    previous = torch.get_num_threads() if enabled else 1
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def small_on_cpu(tensors: list[torch.Tensor], limit: int = SMALL_TENSOR_ELEMENTS) -> bool:
    """Whether ``tensors`` are CPU tensors averaging at most ``limit`` elements
    (``ExecutionOptions.small_tensor_elements``)."""
    if not tensors or tensors[0].device.type != "cpu":
        return False
    return sum(t.numel() for t in tensors) <= limit * len(tensors)
