"""Leaner activations for training passes over a frozen transformers model.

A LoRA training pass keeps, for backward, every tensor the base model's autograd graph saves. Two
common blocks save more than their backward needs, and both can drop the extra at no cost in
arithmetic and with bit-identical gradients:

* **SwiGLU MLP** (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU: Llama, Qwen2/3,
  Qwen3.5, Mistral, ...). Autograd saves ``gate``, ``silu(gate)`` and ``up``; the product's
  backward needs only ``gate`` and ``up``: :class:`SiluMul` recomputes ``silu(gate)`` (one
  elementwise op) and calls the very kernels autograd would (``silu_backward`` and two
  multiplies), so the gradients are bit-identical. One intermediate-sized tensor per layer and
  token fewer: a quarter of the MLP's saved activations (the down projection's LoRA still saves
  its input).
* **Gated RMSNorm** (Qwen3.5's linear-attention output norm, ``norm(x) * silu(gate)``): autograd
  saves four hidden-sized tensors; :class:`Recompute` saves the two inputs and runs the norm's
  forward again inside its backward (a few elementwise ops), half the memory.

:func:`make_lean` rewires the matching modules of ONE model instance (their ``forward``), never
a transformers class, so another model in the process (a peer's, a sampler's) is untouched.
Without gradients (sampling, reference passes) the modules run their own forward. What this saves
per pass is in docs/performance.md ("Leaner activations").
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types

import torch
import torch.nn.functional as F

# The one MLP body this rewrites; any other body (extra ops, another activation) keeps its forward.
_SWIGLU = ast.dump(
    ast.parse("self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))").body[0]
)


class SiluMul(torch.autograd.Function):
    """``silu(gate) * up``, saving ``gate`` and ``up`` only (``silu(gate)`` is recomputed)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        # The kernels autograd's SiluBackward and MulBackward run, in the same order.
        grad_gate = (
            torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        )
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up


class Recompute(torch.autograd.Function):
    """``module(*inputs)`` saving only the inputs; backward runs the forward again with autograd.

    For cheap, deterministic modules without trainable parameters (the caller checks): the
    recomputed graph is the one the plain call would have kept, so the gradients are identical.
    """

    @staticmethod
    def forward(ctx, forward, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.forward = forward
        ctx.autocast = _autocast_state(inputs[0].device.type)
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return forward(*inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inputs = [
            t.detach().requires_grad_(need)
            for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])
        ]
        device_type, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
            out = ctx.forward(*inputs)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad))
        return (None, *(next(grads) if t.requires_grad else None for t in inputs))


def make_lean(model: torch.nn.Module) -> list[str]:
    """Rewire ``model``'s SwiGLU MLPs and gated RMSNorms to keep fewer activations (in place).

    Returns:
        The qualified names of the modules changed (empty for a model with neither block).
    """
    changed = []
    for name, module in model.named_modules():
        if _is_swiglu(module):
            module.forward = types.MethodType(_swiglu_forward, module)
        elif type(module).__name__.endswith("RMSNormGated"):
            module.forward = types.MethodType(_recomputed_forward(type(module).forward), module)
        else:
            continue
        changed.append(name)
    return changed


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)
    return self.down_proj(SiluMul.apply(self.gate_proj(x), self.up_proj(x)))


def _recomputed_forward(plain):
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        needs_graph = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        # A trainable parameter (a tenant training this norm) would need its gradient too.
        if not needs_graph or any(p.requires_grad for p in self.parameters()):
            return plain(self, *inputs)
        return Recompute.apply(functools.partial(plain, self), *inputs)

    return forward


def _is_swiglu(module: torch.nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    if not all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")):
        return False
    if not isinstance(act, torch.nn.SiLU) and type(act).__name__ != "SiLUActivation":
        return False
    return _body_is_swiglu(type(module).forward)


@functools.cache
def _body_is_swiglu(forward) -> bool:
    """Whether ``forward(self, x)`` only returns the SwiGLU expression (directly or via one
    local)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return False
    func = tree.body[0]
    if not isinstance(func, ast.FunctionDef) or [a.arg for a in func.args.args] != ["self", "x"]:
        return False
    body = [
        s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return ast.dump(ast.Expr(body[0].value)) == _SWIGLU
    if (
        len(body) == 2
        and isinstance(body[0], ast.Assign)
        and len(body[0].targets) == 1
        and isinstance(body[0].targets[0], ast.Name)
        and isinstance(body[1], ast.Return)
        and isinstance(body[1].value, ast.Name)
        and body[1].value.id == body[0].targets[0].id
    ):
        return ast.dump(ast.Expr(body[0].value)) == _SWIGLU
    return False


def _autocast_state(device_type: str) -> tuple[str, bool, torch.dtype]:
    return (
        device_type,
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
    )


__all__ = ["Recompute", "SiluMul", "make_lean"]
