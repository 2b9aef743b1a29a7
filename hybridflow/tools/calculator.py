"""A calculator tool: arithmetic on numbers, parsed with ``ast`` and never ``eval``-ed.

Only number literals, ``+ - * / // % **``, unary signs, parentheses and a few pure functions
(``abs``, ``round``, ``min``, ``max``, ``sqrt``) are accepted; any other syntax (names,
attributes, calls to anything else, strings) is refused with a message naming it.

Every call ends within milliseconds, because sizes are checked *before* Python's big-integer
arithmetic runs (``round(7, -30_000_000)`` alone would build a 30-million-digit power of ten):

* the expression has at most :data:`MAX_EXPRESSION_CHARS` characters, so at most a few hundred
  operations;
* every number — literal, intermediate result, function argument, final result — is an integer
  of at most :data:`MAX_INT_DIGITS` digits or a finite float;
* a power's exponent is at most :data:`MAX_EXPONENT` in size, and an integer power whose result
  would pass :data:`MAX_INT_DIGITS` digits is refused from the sizes of its operands; so is an
  integer product (estimated from the operands' bit lengths);
* ``round``'s ``ndigits`` is a whole number between ``-MAX_INT_DIGITS`` and
  ``MAX_INT_DIGITS`` (a negative one makes Python build ``10 ** -ndigits``).

Sums, differences, ``//`` and ``%`` of such numbers cannot grow past one digit more than their
operands, and cost microseconds. Anything refused is a ``ValueError`` naming the limit.
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

_INT_LIMIT = 10**MAX_INT_DIGITS  # the smallest integer with more than MAX_INT_DIGITS digits
_INT_LIMIT_BITS = _INT_LIMIT.bit_length()

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
        return _eval(tree.body)
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _checked(node.value)  # a literal such as 1e999 is already inf
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        elif isinstance(node.op, ast.Mult):
            _check_product(left, right)
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
            return _call(node.func.id, [_eval(arg) for arg in node.args])
        raise ValueError(f"unknown function {ast.unparse(node.func)!r}; functions: {', '.join(_FUNCTIONS)}")
    if isinstance(node, ast.Name):
        raise ValueError(f"unknown name {node.id!r}; only numbers and the functions {', '.join(_FUNCTIONS)}")
    raise ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _call(name: str, args: list[Number]) -> Number:
    """One of :data:`_FUNCTIONS` on checked arguments; ``round``'s ``ndigits`` is bounded first."""
    for arg in args:
        _checked(arg)
    if name == "round" and len(args) == 2:
        ndigits = args[1]
        if not isinstance(ndigits, int):
            raise ValueError(f"round()'s ndigits must be a whole number, got {ndigits!r}")
        if abs(ndigits) > MAX_INT_DIGITS:
            raise ValueError(f"round()'s ndigits must be between {-MAX_INT_DIGITS} and {MAX_INT_DIGITS}, got {ndigits}")
    try:
        return _checked(_FUNCTIONS[name](*args))
    except OverflowError:  # sqrt of an integer beyond the float range
        raise ValueError(f"{name}(): the argument is too large") from None
    except TypeError as exc:  # the wrong number of arguments
        raise ValueError(f"{name}(): {exc}") from None


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power whose result would be huge before computing it."""
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {format_number(exponent)} is larger than {MAX_EXPONENT}")
    if (isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0
            and exponent * math.log10(abs(base)) > MAX_INT_DIGITS):
        raise ValueError(f"the result would have more than {MAX_INT_DIGITS} digits")


def _check_product(left: Number, right: Number) -> None:
    """Refuse an integer product that is certainly too large before computing it: a product of
    an ``a``-bit and a ``b``-bit integer is at least ``2 ** (a + b - 2)``."""
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() - 2 >= _INT_LIMIT_BITS:
        raise ValueError(f"the result would have more than {MAX_INT_DIGITS} digits")


def _checked(value: Number) -> Number:
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
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
    """``calculator(expression)``: the value of an arithmetic expression, as text.

    Bounded by size checks, not by a timer: an expression of at most 500 characters whose
    numbers stay within 1000 digits (or finite floats) is evaluated in milliseconds, and anything
    larger is refused before it is computed (see the module docstring). The agent loop's
    ``tool_timeout_s`` still applies on top, as to every tool.
    """

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
