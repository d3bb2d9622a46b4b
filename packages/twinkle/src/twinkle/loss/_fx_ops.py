"""The allow-list of a server-side custom loss: each op name a traced graph may use, mapped to
the torch (or ``operator``) function the server calls for it.

Names are as the Tinker SDK sends them: ``call_function`` targets by qualified name
(``torch.exp``, ``operator.mul``), ``call_method`` targets by ``torch.Tensor`` method name.
Every entry is a pure function of its arguments: no in-place op, no factory taking a size, no
I/O, nothing that leaves torch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

_ELEMENTWISE = (
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs", "neg", "sigmoid", "tanh", "square",
    "sign", "reciprocal", "relu", "isfinite", "isnan", "nan_to_num",
    "logical_and", "logical_or", "logical_not", "logical_xor",
)  # fmt: skip
_BINARY = (
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "minimum",
    "maximum",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
)
_CLAMPS = ("clamp", "clip", "clamp_min", "clamp_max", "where")
_REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min")
_LIKE = ("zeros_like", "ones_like", "full_like")

FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{
        f"operator.{name}": getattr(operator, name)
        for name in (
            "add",
            "sub",
            "mul",
            "truediv",
            "neg",
            "pos",
            "pow",
            "abs",
            "getitem",
            "lt",
            "le",
            "gt",
            "ge",
            "eq",
            "ne",
            "and_",
            "or_",
            "xor",
            "invert",
        )
    },  # fmt: skip
    **{
        f"torch.{name}": getattr(torch, name)
        for name in (*_ELEMENTWISE, *_BINARY, *_CLAMPS, *_REDUCTIONS, *_LIKE, "detach")
    },
    "torch.nn.functional.relu": F.relu,
    "torch._C._nn.softplus": F.softplus,
    "torch.nn.functional.softplus": F.softplus,
    "torch.nn.functional.logsigmoid": F.logsigmoid,
    "torch._C._nn.log_sigmoid": F.logsigmoid,
    "getattr": None,  # only for the attributes in ATTRIBUTES, see fx_graph._getattr
}

_TENSOR_METHODS = (
    *_ELEMENTWISE, *_BINARY, *_CLAMPS, *_REDUCTIONS,
    "detach", "float", "double", "long", "int", "bool", "to", "type_as",
    "unsqueeze", "squeeze", "flatten", "reshape", "view", "size", "dim", "numel", "masked_fill",
)  # fmt: skip

METHODS: dict[str, Callable[..., Any]] = {
    name: getattr(torch.Tensor, name) for name in _TENSOR_METHODS
}

#: Tensor attributes ``getattr`` may read.
ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T"})

#: Keyword arguments no call may take: they write into a tensor the graph does not own.
FORBIDDEN_KWARGS = frozenset({"out", "inplace"})

#: The ``{"dtype": ...}`` constants a graph may name.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def allowed_names() -> dict[str, list[str]]:
    """The allow-list as the docs and error messages show it."""
    return {
        "call_function": sorted(FUNCTIONS),
        "call_method": sorted(METHODS),
        "getattr": sorted(ATTRIBUTES),
    }


__all__ = ["ATTRIBUTES", "DTYPES", "FORBIDDEN_KWARGS", "FUNCTIONS", "METHODS", "allowed_names"]
