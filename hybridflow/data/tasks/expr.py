"""The one safe arithmetic evaluator: text parsed with :mod:`ast`, never ``eval``-ed.

Two grammars share one tree walker and one set of size limits:

* :data:`INTEGER_ARITHMETIC` — the built-in tasks' rule (task answers, the countdown scorer's
  check of a model's equation): integer literals written in decimal, ``+ - * /`` and
  parentheses, at most 200 characters; no unary signs, decimals, powers, names or calls.
  Arithmetic is exact (:class:`fractions.Fraction`), so ``(7 / 2) * 2`` is 7, not 7.000000001.
  Use it through :func:`evaluate_expression`, which raises :class:`ExpressionError` for
  anything else, division by zero included.
* :data:`CALCULATOR` — the calculator tool (:mod:`hybridflow.tools.calculator`): number literals
  (integers and floats), ``+ - * / // % **``, unary signs, parentheses and the pure functions
  ``abs``, ``round``, ``min``, ``max``, ``sqrt``, at most 500 characters; ``^``, ``×`` and ``÷``
  are read as ``**``, ``*`` and ``/``. Results are ``int`` or ``float``.

Every grammar refuses anything else (names, attributes, calls to other functions, strings,
booleans, lists) with a ``ValueError`` naming it, and every evaluation ends within
milliseconds, because sizes are checked *before* Python's big-integer arithmetic runs
(``round(7, -30_000_000)`` alone would build a 30-million-digit power of ten):

* the expression has at most ``grammar.max_chars`` characters, so at most a few hundred
  operations;
* every number — literal, intermediate result, function argument, final result — is an integer
  (or, in exact arithmetic, a fraction whose numerator and denominator are integers) of at most
  :data:`MAX_INT_DIGITS` digits, or a finite float;
* a power's exponent is at most :data:`MAX_EXPONENT` in size, and an integer power whose result
  would pass :data:`MAX_INT_DIGITS` digits is refused from the sizes of its operands; so is an
  integer product (estimated from the operands' bit lengths);
* ``round``'s ``ndigits`` is a whole number between ``-MAX_INT_DIGITS`` and
  ``MAX_INT_DIGITS`` (a negative one makes Python build ``10 ** -ndigits``).

Sums, differences, ``//`` and ``%`` of such numbers cannot grow past one digit more than their
operands, and cost microseconds. :func:`evaluate` raises ``ValueError`` for anything refused
(naming the limit) and ``ZeroDivisionError`` for a division by zero.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MAX_EXPONENT = 1000
MAX_INT_DIGITS = 1000

Number = int | float | Fraction

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


@dataclass(frozen=True)
class Grammar:
    """What one caller accepts; the size limits above hold for every grammar."""

    name: str
    operators: tuple[type[ast.operator], ...]
    max_chars: int
    unary_signs: bool = False
    floats: bool = False
    functions: tuple[str, ...] = ()
    exact: bool = False  # Fraction arithmetic: integer literals become Fractions, "/" is exact
    charset: str | None = None  # a regex every character must match (None: any)
    spellings: tuple[tuple[str, str], ...] = ()  # (written, read as), applied before parsing


INTEGER_ARITHMETIC = Grammar(
    name="an integer expression",
    operators=(ast.Add, ast.Sub, ast.Mult, ast.Div),
    max_chars=200,
    exact=True,
    charset=r"[0-9+\-*/()\s]",  # decimal literals only: no 0x10, 1_000, 1e3
)
CALCULATOR = Grammar(
    name="an arithmetic expression",
    operators=tuple(_BINARY),
    max_chars=500,
    unary_signs=True,
    floats=True,
    functions=tuple(_FUNCTIONS),
    spellings=(("^", "**"), ("×", "*"), ("÷", "/")),
)


class ExpressionError(ValueError):
    """The text is not an expression of :data:`INTEGER_ARITHMETIC`, or cannot be evaluated."""


def evaluate(expression: str, grammar: Grammar) -> Number:
    """The value of ``expression`` under ``grammar``; ``ValueError`` for anything refused,
    ``ZeroDivisionError`` for a division by zero."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > grammar.max_chars:
        raise ValueError(f"expression is longer than {grammar.max_chars} characters")
    text = expression.strip()
    for written, read_as in grammar.spellings:
        text = text.replace(written, read_as)
    if not text:
        raise ValueError("expression is empty")
    if grammar.charset is not None:
        bad = sorted({ch for ch in text if not re.fullmatch(grammar.charset, ch)})
        if bad:
            raise ValueError(f"characters not allowed in {grammar.name}: {''.join(bad)!r}")
    try:
        tree = ast.parse(text, mode="eval")
        return _eval(tree.body, grammar)
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None


def evaluate_expression(text: str) -> Fraction:
    """The exact value of ``text`` under :data:`INTEGER_ARITHMETIC`; :class:`ExpressionError`
    for anything else, division by zero included.

    ``evaluate_expression("(3 + 5) / 2") == Fraction(4)``. Unary signs, decimals, powers,
    names and calls are rejected.
    """
    try:
        value = evaluate(text, INTEGER_ARITHMETIC)
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except ValueError as exc:
        raise ExpressionError(str(exc)) from None
    return Fraction(value)


def expression_numbers(text: str) -> list[int]:
    """The integer literals of ``text`` in order of appearance: ``"(12 + 3) * 4"`` → ``[12, 3, 4]``."""
    return [int(tok) for tok in re.findall(r"\d+", text)]


def _eval(node: ast.AST, grammar: Grammar) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"only numbers are allowed, got {value!r}")
        if isinstance(value, float) and not grammar.floats:
            raise ValueError(f"only integers are allowed in {grammar.name}, got {value!r}")
        return _checked(Fraction(value) if grammar.exact else value)  # a literal such as 1e999 is already inf
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY and grammar.unary_signs:
        return _checked(_UNARY[type(node.op)](_eval(node.operand, grammar)))
    if isinstance(node, ast.BinOp) and type(node.op) in grammar.operators:
        left, right = _eval(node.left, grammar), _eval(node.right, grammar)
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
    if isinstance(node, ast.Call) and grammar.functions:
        if isinstance(node.func, ast.Name) and node.func.id in grammar.functions:
            if node.keywords:
                raise ValueError(f"{node.func.id}() takes no keyword arguments here")
            return _call(node.func.id, [_eval(arg, grammar) for arg in node.args])
        raise ValueError(f"unknown function {ast.unparse(node.func)!r}; functions: {', '.join(grammar.functions)}")
    if isinstance(node, ast.Name) and grammar.functions:
        raise ValueError(f"unknown name {node.id!r}; only numbers and the functions {', '.join(grammar.functions)}")
    what = type(node.op if isinstance(node, ast.BinOp | ast.UnaryOp) else node).__name__
    raise ValueError(f"{what} is not allowed in {grammar.name}")


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


def _integer_parts(value: Number) -> tuple[int, ...]:
    """The integers a value is made of (none for a float)."""
    if isinstance(value, Fraction):
        return value.numerator, value.denominator
    return (value,) if isinstance(value, int) else ()


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power whose result would be huge before computing it."""
    if exponent > MAX_EXPONENT or exponent < -MAX_EXPONENT:  # abs() of the union types as object
        raise ValueError(f"exponent {format_number(exponent)} is larger than {MAX_EXPONENT}")
    if (
        isinstance(exponent, int | Fraction)
        and exponent > 0
        and (not isinstance(exponent, Fraction) or exponent.denominator == 1)
    ):
        for part in _integer_parts(base):
            if abs(part) > 1 and int(exponent) * math.log10(abs(part)) > MAX_INT_DIGITS:
                raise ValueError(f"the result would have more than {MAX_INT_DIGITS} digits")


def _check_product(left: Number, right: Number) -> None:
    """Refuse an integer product that is certainly too large before computing it: a product of
    an ``a``-bit and a ``b``-bit integer is at least ``2 ** (a + b - 2)``. Fractions multiply
    numerators and denominators."""
    pairs = zip(_integer_parts(left), _integer_parts(right))  # empty when either is a float
    if any(a.bit_length() + b.bit_length() - 2 >= _INT_LIMIT_BITS for a, b in pairs):
        raise ValueError(f"the result would have more than {MAX_INT_DIGITS} digits")


def _checked(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not finite")
    if any(abs(part) >= _INT_LIMIT for part in _integer_parts(value)):
        raise ValueError(f"the result has more than {MAX_INT_DIGITS} digits")
    return value


def format_number(value: Number) -> str:
    """Integers as they are; floats without a spurious ``.0`` and to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)
