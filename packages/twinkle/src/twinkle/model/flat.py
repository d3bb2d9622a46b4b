"""A tenant's adapter tensors laid out in one contiguous buffer per kind.

A LoRA adapter is many small tensors: A and B of every adapted linear (30 on the tiny model, 392
on a 28-layer model with every linear adapted). A CPU optimizer step over them pays per tensor:
the multi-tensor ``_foreach`` kernels and the fused Adam kernel loop over the list, so the clip
and step of eight tiny adapters spent most of their time in that loop. With each kind of tensor in one buffer per tenant, a step handles ONE
tensor per tenant:

* weights: every ``lora_A``/``lora_B`` parameter keeps its identity (modules, optimizers and
  checkpoints see the same ``Parameter`` objects) but its data is a view of ``param``;
* gradients: before a backward each parameter's ``.grad`` is a view of ``grad``, so autograd
  accumulates into the buffer; ``zero_grad`` zeroes the buffer and keeps the views. A weight that
  gets no gradient in a step therefore has a zero gradient, not ``None`` (as with Megatron's and
  torch FSDP's flat gradient buffers): every weight of a tenant steps together;
* Adam moments and step counts: the optimizer's per-parameter state (``exp_avg``, ``exp_avg_sq``,
  ``step``) are views of ``exp_avg``, ``exp_avg_sq`` and ``steps``, so ``state_dict`` and
  checkpoints keep torch's per-parameter format, and the optimizer's own ``step()`` works as
  always, while the batched step (:mod:`twinkle.model.multi_step`) updates the whole adapter with
  one fused kernel call.

Adam is elementwise, so one kernel over the buffer computes exactly what one kernel per tensor
does. Anything that replaces the views (``param.grad = other``, ``optimizer.load_state_dict``, a
new optimizer) is noticed: gradients are copied back into a fresh buffer before the next backward,
Adam state is adopted into new buffers at the next batched step, or, when it cannot be (unequal
step counts, amsgrad), that tenant steps tensor by tensor as before.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.model import torch_compat


class FlatAdapter:
    """Contiguous weight, gradient and Adam-state buffers behind one tenant's parameters."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        first = params[0]
        self.params = params
        self.shapes = [p.shape for p in params]
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.param = torch.empty(self.offsets[-1], dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for p, view in zip(params, self.views(self.param)):
                view.copy_(p)
                p.data = view  # the same Parameter object, now backed by the buffer
        self._data_ptrs = [p.data_ptr() for p in params]
        self.grad: torch.Tensor | None = None
        self._grad_views: list[torch.Tensor] = []
        # Adam state: the optimizer and state map it was laid out for, and the buffers.
        self._optimizer: torch.optim.Optimizer | None = None
        self._state_map: Any = None
        self.exp_avg: torch.Tensor | None = None
        self.exp_avg_sq: torch.Tensor | None = None
        self.steps: torch.Tensor | None = None
        # The steps' version counter when their counts were last known equal.
        self._steps_version: object = -1

    @staticmethod
    def build(params: list[torch.nn.Parameter]) -> FlatAdapter | None:
        """A flat layout for ``params``, or None when they cannot share one buffer."""
        if not params:
            return None
        first = params[0]
        if any(
            p.dtype != first.dtype
            or p.device != first.device
            or p.layout != torch.strided
            or p.is_complex()
            for p in params
        ):
            return None
        return FlatAdapter(params)

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """``buffer`` cut into tensors shaped like the parameters."""
        return [
            buffer[start:end].view(shape)
            for start, end, shape in zip(self.offsets, self.offsets[1:], self.shapes)
        ]

    def intact(self) -> bool:
        """Whether every parameter's data still lives in the weight buffer."""
        return all(p.data_ptr() == ptr for p, ptr in zip(self.params, self._data_ptrs))

    # ------------------------------------------------------------------------------ gradients
    def owns_grads(self) -> bool:
        """Whether every parameter's ``.grad`` is its view of the gradient buffer."""
        views = self._grad_views
        return bool(views) and all(p.grad is v for p, v in zip(self.params, views))

    def attach_grads(self) -> None:
        """Before a backward: point every ``.grad`` at the gradient buffer.

        Gradients set from elsewhere (a resumed checkpoint, a data-parallel reduction) are copied
        into a FRESH buffer, so whoever still holds the previous views keeps their values.
        """
        if self.owns_grads():
            return
        buffer = torch.zeros_like(self.param)
        views = self.views(buffer)
        with torch.no_grad():
            for p, view in zip(self.params, views):
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        self.grad, self._grad_views = buffer, views

    def zero_grad(self) -> bool:
        """Zero the gradient buffer in place; False (nothing done) when it is not in use."""
        if not self.owns_grads():
            return False
        self.grad.zero_()  # type: ignore[union-attr]
        return True

    # ------------------------------------------------------------------------------ Adam state
    def adam_buffers(
        self, optimizer: torch.optim.Optimizer, grads_checked: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(param, grad, exp_avg, exp_avg_sq, step)`` for one fused Adam call over the whole
        adapter, or None when this tenant must step tensor by tensor.

        ``step`` is a view of the first parameter's step count; after the kernel has advanced it,
        call :meth:`sync_steps`. The caller has checked that ``optimizer`` is a fused Adam/AdamW
        with one parameter group and no amsgrad, and, with ``grads_checked``, that
        :meth:`owns_grads` holds.
        """
        if not (grads_checked or self.owns_grads()) or not self.intact():
            return None
        group_params = optimizer.param_groups[0]["params"]
        if len(group_params) != len(self.params) or any(
            a is not b for a, b in zip(group_params, self.params)
        ):
            return None
        laid_out = self._optimizer is optimizer and self._state_map is optimizer.state
        if not laid_out and not self._adopt_state(optimizer):
            return None
        steps = self.steps
        assert steps is not None and self.exp_avg is not None and self.exp_avg_sq is not None
        # The step counts change only through the optimizer. When nothing but this class touched
        # them since they were last known equal (same version counter), skip the comparison,
        # which on a GPU would wait for the device.
        if torch_compat.tensor_version(steps) != self._steps_version:
            if len(steps) > 1 and not bool((steps == steps[0]).all()):
                return None  # a tensor stepped alone (it had no gradient): keep per-tensor steps
            self._steps_version = torch_compat.tensor_version(steps)
        return self.param, self.grad, self.exp_avg, self.exp_avg_sq, steps[0]  # type: ignore[return-value]

    def sync_steps(self) -> None:
        """Copy the first step count (advanced by the fused kernel) to every parameter's."""
        steps = self.steps
        if steps is not None:
            if len(steps) > 1:
                steps[1:].fill_(steps[0])
            self._steps_version = torch_compat.tensor_version(steps)

    def _adopt_state(self, optimizer: torch.optim.Optimizer) -> bool:
        """Move the optimizer's per-parameter Adam state into flat buffers (zeros if it has none)."""
        state = optimizer.state
        entries = [state.get(p) for p in self.params]
        fresh = all(not entry for entry in entries)
        if not fresh and not all(
            entry is not None and set(entry) == {"step", "exp_avg", "exp_avg_sq"}
            for entry in entries
        ):
            return False  # partly initialised, or amsgrad's extra moment
        exp_avg = torch.zeros_like(self.param)
        exp_avg_sq = torch.zeros_like(self.param)
        steps = torch.zeros(len(self.params), dtype=torch.float32, device=self.param.device)
        with torch.no_grad():
            if not fresh:
                for i, (entry, m, v) in enumerate(
                    zip(entries, self.views(exp_avg), self.views(exp_avg_sq))
                ):
                    m.copy_(entry["exp_avg"])  # type: ignore[index]
                    v.copy_(entry["exp_avg_sq"])  # type: ignore[index]
                    steps[i] = entry["step"]  # type: ignore[index]
        for i, (p, m, v) in enumerate(
            zip(self.params, self.views(exp_avg), self.views(exp_avg_sq))
        ):
            state[p] = {"step": steps[i], "exp_avg": m, "exp_avg_sq": v}
        self.exp_avg, self.exp_avg_sq, self.steps = exp_avg, exp_avg_sq, steps
        self._optimizer, self._state_map = optimizer, state
        return True
