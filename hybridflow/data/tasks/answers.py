"""Finding and comparing numbers in model output, shared by the numeric scorers (the built-in
tasks' and ``hybridflow/reward/scorers/boxed.py``).

A number is an optional minus sign, digits with optional thousands separators in groups of
three (``1,200``) and an optional decimal part: ``-3``, ``1,200``, ``0.5``. Values are
compared exactly as fractions, so ``"72.0"`` equals ``"72"`` and ``"1,200"`` equals ``"1200"``.
"""

from __future__ import annotations

import re
from fractions import Fraction

NUMBER_PATTERN = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_NUMBER = re.compile(NUMBER_PATTERN)
# "#### 42", "####42", "#### $1,200", "#### -3"
_MARKED = re.compile(r"####\s*\$?\s*(" + NUMBER_PATTERN + ")")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number string (commas, ``$`` and surrounding spaces ignored); None if not one."""
    cleaned = text.strip().replace(",", "").replace("$", "").strip()
    if not re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", cleaned):
        return None
    return Fraction(cleaned)


def last_number(text: str) -> str | None:
    """The last number in ``text`` as written (``"1,200"``), or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def marked_answer(text: str) -> str | None:
    """The number right after the last ``####`` that is followed by one, or None."""
    found = _MARKED.findall(text)
    return found[-1] if found else None


def same_number(candidate: str | None, ground_truth: object) -> bool:
    """True if both parse as numbers with equal value."""
    if candidate is None:
        return False
    a, b = parse_number(candidate), parse_number(str(ground_truth))
    return a is not None and b is not None and a == b
