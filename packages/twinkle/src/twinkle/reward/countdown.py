"""Countdown: an equation over the given numbers, each used once, that reaches the target."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping
from typing import Any

from twinkle.reward.base import Completion, Reward

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"[\d+\-*/().\s]+")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate_arithmetic(expression: str) -> float:
    """Value of ``+ - * /`` arithmetic over numbers and parentheses, without ``eval``.

    Raises:
        ValueError: anything else in the expression (names, calls, powers, ...).
        ZeroDivisionError: a division by zero.
    """

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        raise ValueError(f"not plain arithmetic: {ast.dump(node)}")

    return walk(ast.parse(expression.strip(), mode="eval"))


class CountDownAccuracy(Reward):
    """``1.0`` when the ``<answer>...</answer>`` equation uses exactly the sample's numbers
    (each once, any order), only ``+ - * /`` and parentheses, and equals the target.

    ``target`` and ``nums`` come from the sample's data (``CountdownProcessor`` puts them in
    ``user_data``) or from a ``{'target': ..., 'nums': [...]}`` ground truth. Whatever follows
    an ``=`` in the answer is ignored.
    """

    def score(self, completion: Completion) -> float:
        source: Mapping[str, Any] = completion.data
        if isinstance(completion.reference, Mapping):
            source = completion.reference
        target, nums = source.get("target"), source.get("nums")
        match = _ANSWER.search(completion.text)
        if match is None or target is None or nums is None:
            return 0.0
        equation = match.group(1).split("=")[0]
        if not _ALLOWED_CHARS.fullmatch(equation):
            return 0.0
        used = sorted(int(n) for n in re.findall(r"\d+", equation))
        if used != sorted(int(n) for n in nums):
            return 0.0
        try:
            value = evaluate_arithmetic(equation)
        except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
            return 0.0
        return float(abs(value - float(target)) < 1e-5)
