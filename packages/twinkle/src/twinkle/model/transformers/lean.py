"""Leaner activations for training passes over a frozen transformers model.

A LoRA training pass keeps, for backward, every tensor the base model's autograd graph saves.
The SwiGLU MLP (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU: Llama, Qwen2/3,
Qwen3.5, Mistral, ...) saves more than its backward needs: autograd keeps ``gate``,
``silu(gate)`` and ``up``, and the product's backward needs only ``gate`` and ``up``.
:class:`SiluMul` recomputes ``silu(gate)`` (one elementwise op) and calls the very kernels
autograd would (``silu_backward`` and two multiplies), so the gradients are bit-identical. One
intermediate-sized tensor per layer and token fewer: a quarter of the MLP's saved activations
(the down projection's LoRA still saves its input).

Recomputing more (Qwen3.5's gated RMSNorm, the linear-attention core) was measured and left out:
its cost in step time is larger than what the memory it frees is worth against a smaller pass
budget (docs/performance.md, "Leaner activations").

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


def make_lean(model: torch.nn.Module) -> list[str]:
    """Rewire ``model``'s SwiGLU MLPs to keep fewer activations (in place).

    Returns:
        The qualified names of the modules changed (empty for a model without such an MLP).
    """
    changed = []
    for name, module in model.named_modules():
        if _is_swiglu(module):
            module.forward = types.MethodType(_swiglu_forward, module)
            changed.append(name)
    return changed


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return type(self).forward(self, x)
    return self.down_proj(SiluMul.apply(self.gate_proj(x), self.up_proj(x)))


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


__all__ = ["SiluMul", "make_lean"]
