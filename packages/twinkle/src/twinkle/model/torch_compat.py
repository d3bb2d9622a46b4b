"""Every private torch API the library uses, in one place, each with a public fallback.

torch's underscore APIs (multi-tensor ``_foreach_*`` kernels, the functional Adam, hook
registries, tensor version counters) are what make the multi-tenant step cheap, but they may
change between releases. Each is looked up once, here, when this module is imported; when one is
missing, the fallback gives the same results on the public API (slower, or more conservative:
a hook registry that cannot be read counts as "hooks present", which disables a fast path and
never skips a hook). ``tests/twinkle/model/test_torch_compat.py`` checks each fallback against torch's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def _loop_norm(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.linalg.vector_norm(t) for t in tensors]


def _loop_mul_(tensors: Sequence[torch.Tensor], scalars: Sequence[float]) -> None:
    for tensor, scalar in zip(tensors, scalars, strict=True):
        tensor.mul_(scalar)


def _loop_add_(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    for target, source in zip(targets, sources, strict=True):
        target.add_(source)


foreach_norm: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] = getattr(
    torch, "_foreach_norm", _loop_norm
)
"""The L2 norm of each tensor."""

foreach_mul_: Callable[[Sequence[torch.Tensor], Sequence[float]], None] = getattr(
    torch, "_foreach_mul_", _loop_mul_
)
"""``tensors[i] *= scalars[i]`` in place."""

foreach_add_: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None] = getattr(
    torch, "_foreach_add_", _loop_add_
)
"""``targets[i] += sources[i]`` in place."""


def _functional_adam() -> Callable[..., None] | None:
    try:
        from torch.optim.adam import adam
    except ImportError:
        return None
    return adam


adam_functional: Callable[..., None] | None = _functional_adam()
"""torch's functional Adam (one fused kernel over many tenants' tensors), or None: then every
optimizer takes its own ``step()``."""


_MISSING = object()


def optimizer_has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether step hooks are registered on ``optimizer`` (True when it cannot be told)."""
    pre = getattr(optimizer, "_optimizer_step_pre_hooks", _MISSING)
    post = getattr(optimizer, "_optimizer_step_post_hooks", _MISSING)
    return pre is _MISSING or post is _MISSING or bool(pre) or bool(post)


def param_has_grad_hooks(param: torch.Tensor) -> bool:
    """Whether gradient hooks are registered on ``param`` (True when it cannot be told), which
    only autograd's own accumulation would run."""
    backward = getattr(param, "_backward_hooks", _MISSING)
    post = getattr(param, "_post_accumulate_grad_hooks", _MISSING)
    return backward is _MISSING or post is _MISSING or bool(backward) or bool(post)


def tensor_version(tensor: torch.Tensor) -> Any:
    """The in-place version counter of ``tensor``, or a fresh object (never equal to an earlier
    answer) when torch has none, so a cached comparison is always redone."""
    version = getattr(tensor, "_version", None)
    return object() if version is None else version


__all__ = [
    "adam_functional",
    "foreach_add_",
    "foreach_mul_",
    "foreach_norm",
    "optimizer_has_step_hooks",
    "param_has_grad_hooks",
    "tensor_version",
]
