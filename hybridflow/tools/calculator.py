"""A calculator tool: arithmetic on numbers, parsed with ``ast`` and never ``eval``-ed.

The evaluation is the project's one safe arithmetic evaluator,
:func:`hybridflow.data.tasks.expr.evaluate` with its :data:`~hybridflow.data.tasks.expr.CALCULATOR`
grammar: number literals, ``+ - * / // % **`` (``^``, ``×``, ``÷`` read as ``**``, ``*``, ``/``),
unary signs, parentheses and a few pure functions (``abs``, ``round``, ``min``, ``max``,
``sqrt``); any other syntax (names, attributes, calls to anything else, strings) is refused with
a message naming it.

Every call ends within milliseconds, because sizes are checked *before* Python's big-integer
arithmetic runs (``round(7, -30_000_000)`` alone would build a 30-million-digit power of ten):
at most :data:`MAX_EXPRESSION_CHARS` characters, integers of at most :data:`MAX_INT_DIGITS`
digits or finite floats, exponents of at most :data:`MAX_EXPONENT`, and powers, products and
``round``'s ``ndigits`` bounded from their operands' sizes (the rules are listed in
:mod:`hybridflow.data.tasks.expr`). Anything refused is a ``ValueError`` naming the limit.
"""

from __future__ import annotations

from typing import Any

from hybridflow.data.tasks import expr
from hybridflow.data.tasks.expr import (
    MAX_EXPONENT,
    MAX_INT_DIGITS,
    Number,
    format_number,
)
from hybridflow.tools.base import BaseTool, ToolOutput, one_string_param_schema

MAX_EXPRESSION_CHARS = expr.CALCULATOR.max_chars


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; ``ValueError`` (or ``ZeroDivisionError``) otherwise."""
    return expr.evaluate(expression, expr.CALCULATOR)


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the value of an arithmetic expression, as text.

    Bounded by size checks, not by a timer: an expression of at most 500 characters whose
    numbers stay within 1000 digits (or finite floats) is evaluated in milliseconds, and anything
    larger is refused before it is computed (see the module docstring). The agent loop's
    ``tool_timeout_s`` still applies on top, as to every tool.
    """

    def default_schema(self) -> dict[str, Any]:
        return one_string_param_schema(
            "calculator",
            "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
            "expression",
            "the expression, e.g. (12 + 7) * 3",
        )

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        if "expression" not in parameters:
            raise ValueError("missing required argument: expression")
        return format_number(evaluate(parameters["expression"])), 0.0, {}


__all__ = ["MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "MAX_INT_DIGITS", "CalculatorTool", "evaluate", "format_number"]
