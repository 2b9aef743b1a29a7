"""The one safe arithmetic evaluator behind the tasks (integer grammar) and the calculator tool."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from hybridflow.data.tasks.expr import (
    CALCULATOR,
    INTEGER_ARITHMETIC,
    ExpressionError,
    evaluate,
    evaluate_expression,
)
from hybridflow.tools import calculator


@pytest.mark.parametrize("text", ["0x10", "1_000", "1e3", "1.5 + 1", "-2 + 3", "2 ** 3", "7 // 2", "7 % 2",
                                  "abs(3)", "x", "2 ^ 3", "3 × 4", "True + 1", "'a'", "[1]"])
def test_the_integer_grammar_refuses_all_but_decimal_integers_and_four_operators(text):
    with pytest.raises(ExpressionError):
        evaluate_expression(text)


def test_the_integer_grammar_is_exact_and_bounded():
    assert evaluate_expression("7 / 3 * 3") == 7 and isinstance(evaluate_expression("7 / 3"), Fraction)
    assert evaluate_expression(" (12 + 3) * 4 ") == 60
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate_expression("1 / (2 - 2)")
    with pytest.raises(ExpressionError, match="longer than 200"):
        evaluate_expression("1" * 201)
    assert evaluate_expression("(" * 99 + "1" + ")" * 99) == 1
    wider = replace(INTEGER_ARITHMETIC, max_chars=2000)  # the calculator's size rule holds here too
    with pytest.raises(ValueError, match="more than 1000 digits"):
        evaluate(" * ".join(["9" * 99] * 11), wider)


@pytest.mark.parametrize("text", ["(3 + 5) / 2", "7 / 2 * 2", "2 + 3 * 4", "(12 + 3) * 4 - 60"])
def test_the_calculator_accepts_every_task_expression_with_the_same_value(text):
    assert evaluate(text, CALCULATOR) == evaluate_expression(text)
    assert calculator.evaluate(text) == evaluate_expression(text)


def test_the_calculator_keeps_its_own_errors():
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        calculator.evaluate("1/0")
    with pytest.raises(ValueError, match="unknown name 'x'") as info:
        calculator.evaluate("x + 1")
    assert type(info.value) is ValueError  # the tool's message names ValueError, as before
