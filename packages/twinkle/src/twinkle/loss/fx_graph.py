"""Server-side custom losses: a torch.fx graph sent as plain data (the Tinker SDK's
``CustomLossGraph``), rebuilt into our own node list and run by our own interpreter.

Nothing the client sends is executed as Python: :func:`parse_graph` checks every node against the
allow-list of :mod:`twinkle.loss._fx_ops` (refusing with an error that names the op), and
:meth:`LossGraph.run` maps each node to the torch function the allow-list gives for its name.
Before each call the op is run on ``meta`` tensors of the same shapes, so a call whose result
would be over :data:`MAX_ELEMENTS` is refused before it allocates anything.

:class:`CustomGraphLoss` (loss name ``custom``) runs the graph once per datum on that datum's
target log-probs and its ``loss_fn_inputs`` and sums the losses, as the SDK's client-side path
does; the gradient reaches the adapter through autograd like any built-in loss.
"""

from __future__ import annotations

import math
import operator
import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.loss import _fx_ops as ops
from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens
from twinkle.loss.registry import register_loss

MAX_NODES = 512
MAX_INPUTS = 16
MAX_ELEMENTS = 1 << 24  # elements of any one tensor a node makes (64 MiB of float32)
MAX_SECONDS = 10.0  # wall time of one request's graph evaluations (all datums)
MAX_ARG_DEPTH = 8
_METRIC_KEY = re.compile(r"custom/[a-z0-9_./-]{1,64}:(sum|mean)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Ref:
    """A reference to an earlier node's value."""

    name: str


@dataclass(frozen=True)
class Node:
    """One checked node: ``kind`` is ``call_function`` or ``call_method``."""

    name: str
    kind: str
    target: str
    args: tuple
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class LossGraph:
    """A parsed, allow-listed custom loss: ``inputs`` are ``(name, rank)``, ``logprobs`` first."""

    inputs: tuple[tuple[str, int], ...]
    nodes: tuple[Node, ...]
    loss: Any  # a Ref
    metrics: dict[str, Any]  # metric key -> Ref

    def run(self, values: list[torch.Tensor], deadline: float) -> tuple[torch.Tensor, dict]:
        """Evaluate on one datum's ``values`` (in ``inputs`` order): ``(scalar loss, metrics)``."""
        env: dict[str, Any] = {name: value for (name, _), value in zip(self.inputs, values)}
        for node in self.nodes:
            if time.monotonic() > deadline:
                raise InvalidArgumentError(
                    f"custom loss: over the time limit of {MAX_SECONDS:g} s (at node {node.name!r})"
                )
            env[node.name] = _call(node, _resolve(node.args, env), _resolve(node.kwargs, env))
        loss = env[self.loss.name]
        if not (isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.is_floating_point()):
            raise InvalidArgumentError(
                f"custom loss must return a scalar float loss, got {_describe(loss)}"
            )
        metrics = {}
        for key, ref in self.metrics.items():
            value = env[ref.name]
            if not (isinstance(value, torch.Tensor) and value.numel() == 1):
                raise InvalidArgumentError(
                    f"custom loss metric {key!r} must be a scalar, got {_describe(value)}"
                )
            metrics[key] = float(value.detach())
        return loss, metrics


def parse_graph(graph: Any, inputs: Any) -> LossGraph:
    """Check a ``CustomLossGraph`` (as JSON) and its ``inputs`` against the allow-list.

    Raises:
        InvalidArgumentError: Anything not allowed, naming the node and its op.
    """
    if not isinstance(graph, dict) or graph.get("format", 1) != 1:
        raise InvalidArgumentError("custom loss graph must be an object of format 1")
    nodes = graph.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise InvalidArgumentError("custom loss graph has no nodes")
    if len(nodes) > MAX_NODES:
        raise InvalidArgumentError(
            f"custom loss graph has {len(nodes)} nodes, over the limit of {MAX_NODES}"
        )
    declared = _inputs(inputs)
    placeholders, body, output, seen = [], [], None, set()
    for i, raw in enumerate(nodes):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidArgumentError(f"custom loss graph node {i} is malformed")
        name, kind, target = raw["name"], raw.get("op"), raw.get("target")
        if not _NAME.fullmatch(name) or name in seen:
            raise InvalidArgumentError(
                f"custom loss graph node name {name!r} is invalid or repeated"
            )
        if output is not None:
            raise InvalidArgumentError("custom loss graph has nodes after its output")
        args = _decode(raw.get("args", []), seen, f"node {name!r}", 0)
        kwargs = _decode({"dict": raw.get("kwargs", {})}, seen, f"node {name!r}", 0)
        if kind == "placeholder":
            if body:
                raise InvalidArgumentError("custom loss graph placeholders must come first")
            placeholders.append(target)
        elif kind in ("call_function", "call_method"):
            _check_call(name, kind, target, args, kwargs)
            body.append(Node(name, kind, target, tuple(args), kwargs))
        elif kind == "output":
            output = args
        else:
            raise InvalidArgumentError(
                f"custom loss graph node {name!r}: op {kind!r} ({target!r}) is not allowed; "
                "only placeholder, call_function, call_method and output are"
            )
        seen.add(name)
    if placeholders != [n for n, _ in declared]:
        raise InvalidArgumentError(
            f"custom loss graph takes {placeholders}, but its inputs are {[n for n, _ in declared]}"
        )
    loss, metrics = _output(output)
    return LossGraph(declared, tuple(body), loss, metrics)


def _inputs(inputs: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_INPUTS:
        raise InvalidArgumentError(f"custom loss needs 1 to {MAX_INPUTS} inputs, logprobs first")
    out = []
    for item in inputs:
        name, rank = (
            (item.get("name"), item.get("rank")) if isinstance(item, dict) else (None, None)
        )
        if not isinstance(name, str) or not _NAME.fullmatch(name) or rank not in (0, 1, 2):
            raise InvalidArgumentError(f"custom loss input {item!r} needs a name and a rank 0-2")
        out.append((name, rank))
    if out[0][0] != "logprobs":
        raise InvalidArgumentError("a custom loss's first input is logprobs")
    if out[0][1] != 1:
        raise InvalidArgumentError(
            "custom loss: logprobs of rank 2 ([T, K]) are not supported by this server; use rank 1"
        )
    if len({n for n, _ in out}) != len(out):
        raise InvalidArgumentError("custom loss inputs repeat a name")
    return tuple(out)


def _decode(value: Any, seen: set[str], where: str, depth: int) -> Any:
    """The SDK's argument encoding (see ``CustomLossNode.args``) back into values and Refs."""
    if depth > MAX_ARG_DEPTH:
        raise InvalidArgumentError(f"custom loss {where}: arguments nest too deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, seen, where, depth + 1) for v in value]
    if not (isinstance(value, dict) and len(value) == 1):
        raise InvalidArgumentError(f"custom loss {where}: malformed argument {value!r}")
    ((kind, inner),) = value.items()
    if kind == "ref":
        if inner not in seen:
            raise InvalidArgumentError(f"custom loss {where}: refers to unknown node {inner!r}")
        return Ref(inner)
    if kind == "tuple" and isinstance(inner, list):
        return tuple(_decode(v, seen, where, depth + 1) for v in inner)
    if kind == "dict" and isinstance(inner, dict):
        return {str(k): _decode(v, seen, where, depth + 1) for k, v in inner.items()}
    if kind == "slice" and isinstance(inner, list) and len(inner) == 3:
        return slice(*(_decode(v, seen, where, depth + 1) for v in inner))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float" and inner in ("inf", "-inf", "nan"):
        return float(inner)
    if kind == "dtype" and inner in ops.DTYPES:
        return ops.DTYPES[inner]
    raise InvalidArgumentError(
        f"custom loss {where}: argument {value!r} is not allowed (devices, layouts, memory "
        "formats and unknown dtypes are refused)"
    )


def _check_call(name: str, kind: str, target: Any, args: list, kwargs: dict) -> None:
    table = ops.FUNCTIONS if kind == "call_function" else ops.METHODS
    if target not in table:
        raise InvalidArgumentError(
            f"custom loss graph node {name!r}: {kind} {target!r} is not on this server's "
            "allow-list of custom loss ops (see docs/losses.md)"
        )
    bad = sorted(k for k in kwargs if k in ops.FORBIDDEN_KWARGS and kwargs[k] not in (None, False))
    if bad:
        raise InvalidArgumentError(
            f"custom loss graph node {name!r}: keyword {bad[0]!r} is refused"
        )
    if kind == "call_method" and not (args and isinstance(args[0], Ref)):
        raise InvalidArgumentError(f"custom loss graph node {name!r}: a method needs a tensor")
    if target == "getattr" and not (len(args) == 2 and args[1] in ops.ATTRIBUTES):
        raise InvalidArgumentError(
            f"custom loss graph node {name!r}: getattr of {args[1:]!r} is not allowed; "
            f"only {sorted(ops.ATTRIBUTES)}"
        )
    if target == "to" and (
        any(not isinstance(a, torch.dtype) for a in args[1:]) or set(kwargs) - {"dtype"}
    ):
        raise InvalidArgumentError(f"custom loss graph node {name!r}: .to() takes only a dtype")


def _output(output: Any) -> tuple[Ref, dict[str, Ref]]:
    value = output[0] if isinstance(output, list) and len(output) == 1 else None
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], Ref)):
        raise InvalidArgumentError("custom loss graph must return (loss, metrics)")
    metrics = value[1]
    if not isinstance(metrics, dict) or not all(
        _METRIC_KEY.fullmatch(k) and isinstance(v, Ref) for k, v in metrics.items()
    ):
        raise InvalidArgumentError(
            "custom loss metrics must map custom/<name>:sum or :mean to tensors"
        )
    return value[0], metrics


def _resolve(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    return value


def _call(node: Node, args: tuple, kwargs: dict) -> Any:
    if node.target == "getattr":
        return getattr(args[0], args[1])
    fn = ops.FUNCTIONS[node.target] if node.kind == "call_function" else ops.METHODS[node.target]
    if fn is operator.pow and not any(isinstance(a, torch.Tensor) for a in args):
        if abs(float(args[1])) > 64:  # Python big-int powers cost unbounded time
            raise InvalidArgumentError(f"custom loss node {node.name!r}: exponent over 64")
    _check_size(node, fn, args, kwargs)
    try:
        result = fn(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        raise InvalidArgumentError(
            f"custom loss node {node.name!r} ({node.target}) failed: {exc}"
        ) from None
    for tensor in _tensors(result):
        if tensor.numel() > MAX_ELEMENTS:
            raise InvalidArgumentError(_too_big(node, tensor.shape))
    if isinstance(result, int) and not isinstance(result, bool) and abs(result) > 1 << 62:
        raise InvalidArgumentError(f"custom loss node {node.name!r}: integer out of range")
    return result


def _check_size(node: Node, fn: Any, args: tuple, kwargs: dict) -> None:
    """Refuse a call whose result would be over MAX_ELEMENTS, by running it on meta tensors."""
    if not _tensors((args, kwargs)):
        return
    try:
        meta = fn(*_to_meta(args), **_to_meta(kwargs))
    except Exception:  # noqa: BLE001 - data-dependent ops (masks) have no meta shape
        return
    for tensor in _tensors(meta):
        if tensor.numel() > MAX_ELEMENTS:
            raise InvalidArgumentError(_too_big(node, tensor.shape))


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _too_big(node: Node, shape: Any) -> str:
    return (
        f"custom loss node {node.name!r} ({node.target}) makes a tensor of shape {tuple(shape)}, "
        f"over the limit of {MAX_ELEMENTS} elements"
    )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def input_tensor(spec: dict[str, Any], rank: int, name: str) -> torch.Tensor:
    """One datum's input from its wire form ``{'data': [...], 'shape': [...]}`` at ``rank``."""
    data, shape = spec.get("data"), spec.get("shape")
    tensor = torch.as_tensor(data)
    if tensor.dtype == torch.float64:
        tensor = tensor.float()
    if rank == 0:
        if tensor.numel() != 1:
            raise InvalidArgumentError(
                f"custom loss input {name!r} is rank 0 but has {tensor.numel()} values"
            )
        return tensor.reshape(())
    if rank == 2:
        if not (isinstance(shape, list) and len(shape) == 2 and math.prod(shape) == tensor.numel()):
            raise InvalidArgumentError(
                f"custom loss input {name!r} is rank 2 but has shape {shape}"
            )
        return tensor.reshape(shape)
    return tensor.reshape(-1)


@register_loss("custom")
class CustomGraphLoss(Loss):
    """Tinker's ``custom`` loss: a parsed graph run per datum, the losses summed.

    Args:
        graph: The ``CustomLossGraph`` as JSON.
        inputs: The ``CustomLossInput`` list as JSON (``logprobs`` first).
        values: Per datum, the wire form of each input after ``logprobs`` (see
            :func:`input_tensor`).
    """

    def __init__(self, graph: Any = None, inputs: Any = None, values: Any = None):
        self.graph = parse_graph(graph, inputs)
        if not isinstance(values, list):
            raise InvalidArgumentError("custom loss needs the per-datum input values")
        self.values = values

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T, mask_B_T = inputs.logprobs, inputs.mask.bool()
        if lp_B_T.shape[0] != len(self.values):
            raise InvalidArgumentError(
                f"custom loss has inputs for {len(self.values)} datums, the batch has {lp_B_T.shape[0]}"
            )
        deadline = time.monotonic() + MAX_SECONDS
        total, sums = None, {}
        for row, datum_values in enumerate(self.values):
            tensors = [lp_B_T[row][mask_B_T[row]]]
            for (name, rank), spec in zip(self.graph.inputs[1:], datum_values, strict=True):
                tensors.append(input_tensor(spec, rank, name).to(lp_B_T.device))
            loss, metrics = self.graph.run(tensors, deadline)
            total = loss if total is None else total + loss
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        rows = max(1, len(self.values))
        metrics = {k: v / rows if k.endswith(":mean") else v for k, v in sums.items()}
        return LossOutput(
            loss=total.to(lp_B_T.dtype),
            num_tokens=num_tokens(inputs.mask),
            metrics={"loss": float(total.detach()), **metrics},
        )


__all__ = [
    "MAX_ELEMENTS",
    "MAX_NODES",
    "MAX_SECONDS",
    "CustomGraphLoss",
    "LossGraph",
    "parse_graph",
]
