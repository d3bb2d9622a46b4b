"""Host and model measurements of the training benchmark (bench/multi_tenant_train.py): tensor
bytes a model holds, the host's small-GEMM probe, how many timed rounds fit, the machine line."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import torch

from twinkle.model import MultiLoraTransformersModel
from twinkle.model.threads import one_thread


def tensor_state_bytes(model: MultiLoraTransformersModel) -> int:
    """Bytes of every distinct tensor storage the model holds: weights, grads, optimizer state."""
    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    for p in model.model.parameters():
        add(p)
        add(p.grad)
    for buf in model.model.buffers():
        add(buf)
    for tenant in model.tenants.values():
        if tenant.optimizer is not None:
            for state in tenant.optimizer.state.values():
                for value in state.values():
                    add(value)
    return sum(seen.values())


def adapter_state_bytes(model: MultiLoraTransformersModel, name: str) -> int:
    """Theory: adapter params + grads + Adam's two moments = 4 x the parameter bytes."""
    return 4 * sum(p.numel() * p.element_size() for p in model.tenants[name].params)


def timed_steps(round_seconds: float, budget_seconds: float, low: int, high: int) -> int:
    """How many timed rounds fit ``budget_seconds``, kept within ``[low, high]``.

    Fast points get more samples: on a shared 2-core VM single steps vary by +-10%, and the
    median of 15 rounds moved a ratio by +-2% between readings of the same point.
    """
    if round_seconds <= 0:
        return high
    return max(low, min(high, int(budget_seconds / round_seconds)))


def small_gemm_us(calls: int = 1000) -> dict[str, float]:
    """Microseconds per ``128x64 @ 64x16`` CPU ``mm`` on torch's threads and on one thread.

    A probe of the host, not of Twinkle: on the 2-vCPU development VM the two-thread figure
    moves between ~4.9 us and ~7.5 us from minute to minute while the one-thread figure stays at
    ~4.8 us (the second vCPU answers the thread pool slowly at times). Steps made of many small
    GEMMs (the tiny model at B=1, most of all with mixed ranks) slow down with it, so each point
    records the probe before and after its timed rounds.
    """
    x, a = torch.randn(128, 64), torch.randn(16, 64)
    out: dict[str, float] = {}
    for label in ("threads", "one_thread"):
        with one_thread(label == "one_thread"):
            for _ in range(calls // 5):
                torch.mm(x, a.t())
            start = time.perf_counter()
            for _ in range(calls):
                torch.mm(x, a.t())
            out[label] = round((time.perf_counter() - start) / calls * 1e6, 2)
    return out


def machine() -> dict[str, Any]:
    return {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
