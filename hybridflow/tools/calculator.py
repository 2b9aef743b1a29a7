"""A calculator tool: arithmetic on numbers, parsed with ``ast`` and never ``eval``-ed.

Only number literals, ``+ - * / // % **``, unary signs, parentheses and a few pure functions
(``abs``, ``round``, ``min``, ``max``, ``sqrt``) are accepted; any other syntax (names,
attributes, calls to anything else, strings) is refused with a message naming it. Sizes are
bounded so ``9**9**9`` cannot hang a rollout: exponents and integer results have limits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from hybridflow.tools.base import BaseTool, ToolOutput

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_INT_DIGITS = 1000

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
}


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; ``ValueError`` (or ``ZeroDivisionError``) otherwise."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise ValueError("expression is empty")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except OverflowError:
            raise ValueError("the result is too large") from None
        if isinstance(result, complex):
            raise ValueError("the result is not a real number")
        return _checked(result)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            if node.keywords:
                raise ValueError(f"{node.func.id}() takes no keyword arguments here")
            return _checked(_FUNCTIONS[node.func.id](*[_eval(arg) for arg in node.args]))
        raise ValueError(f"unknown function {ast.unparse(node.func)!r}; functions: {', '.join(_FUNCTIONS)}")
    if isinstance(node, ast.Name):
        raise ValueError(f"unknown name {node.id!r}; only numbers and the functions {', '.join(_FUNCTIONS)}")
    raise ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power whose result would be huge before computing it."""
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log10(abs(base)) > MAX_INT_DIGITS:
            raise ValueError(f"the result would have more than {MAX_INT_DIGITS} digits")


def _checked(value: Number) -> Number:
    if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
        raise ValueError(f"the result has more than {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not finite")
    return value


def format_number(value: Number) -> str:
    """Integers as they are; floats without a spurious ``.0`` and to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the value of an arithmetic expression, as text."""

    def default_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {"type": "string", "description": "the expression, e.g. (12 + 7) * 3"}
                    },
                    "required": ["expression"],
                },
            },
        }

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        if "expression" not in parameters:
            raise ValueError("missing required argument: expression")
        return format_number(evaluate(parameters["expression"])), 0.0, {}
