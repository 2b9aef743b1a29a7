"""Exact, safe evaluation of small integer arithmetic expressions (``+ - * /`` and parentheses).

Used to compute built-in task answers and, by the countdown scorer, to check a model's
equation. Python's ``eval`` is never used: the text is parsed with :mod:`ast` and only
integer literals, the four binary operators and parentheses are accepted. Division is exact
(:class:`fractions.Fraction`), so ``(7 / 2) * 2`` is 7, not 7.000000001.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_ALLOWED_CHARS = re.compile(r"^[0-9+\-*/()\s]+$")


class ExpressionError(ValueError):
    """The text is not an expression of integers, ``+ - * /`` and parentheses, or cannot be evaluated."""


def evaluate_expression(text: str) -> Fraction:
    """The exact value of ``text``; raises :class:`ExpressionError` for anything else.

    ``evaluate_expression("(3 + 5) / 2") == Fraction(4)``. Unary signs, decimals, powers,
    names and calls are rejected, as is division by zero.
    """
    text = text.strip()
    if not text:
        raise ExpressionError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not _ALLOWED_CHARS.match(text):
        raise ExpressionError(f"only digits, + - * / and parentheses are allowed: {text!r}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not a valid expression: {text!r}") from exc
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _OPS[type(node.op)](left, right)
    raise ExpressionError(f"unsupported element {ast.dump(node)[:40]}")


def expression_numbers(text: str) -> list[int]:
    """The integer literals of ``text`` in order of appearance: ``"(12 + 3) * 4"`` → ``[12, 3, 4]``."""
    return [int(tok) for tok in re.findall(r"\d+", text)]
