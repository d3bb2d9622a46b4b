"""Run small CPU work on one intra-op thread.

On a CPU, torch splits many kernels across its thread pool; for small tensors the pool's fork/join
costs more than the arithmetic. Measured on the 2-core development machine: a 128x64x16 ``mm``
takes ~4.9 us on one thread and ~8 us on two (~4.9 us on two when the VM's second vCPU answers
the pool promptly, which it does only at times; see docs/performance.md), and one optimizer step
over eight rank-16 tiny-model adapters (240 small tensors) 3.1 ms instead of 3.8 ms.
``one_thread(True)`` drops to one thread for the block and restores the previous count; it is
cheap (~0.1 us) and affects only performance.
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


def small_on_cpu(tensors: list[torch.Tensor]) -> bool:
    """Whether ``tensors`` are CPU tensors averaging at most ``SMALL_TENSOR_ELEMENTS`` elements."""
    if not tensors or tensors[0].device.type != "cpu":
        return False
    return sum(t.numel() for t in tensors) <= SMALL_TENSOR_ELEMENTS * len(tensors)
