r"""Scorers for competition-math sources: answer extraction, normalisation, equivalence.

Two styles, as verl users know them:

* **boxed** (``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``,
  the ``numina_*`` sources — verl's ``math_reward`` / ``prime_math``): the answer is the last
  ``\boxed{...}`` of the response (balanced braces, so ``\boxed{\frac{\sqrt{2}}{2}}`` is whole);
  score 1.0 if it is equivalent to the ground truth, else 0.0.
* **math_dapo** (``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*`` — verl's
  ``math_dapo``): the answer is the last ``Answer: ...`` line within the response's last 300
  characters (Minerva style), else its last ``\boxed{}``; score +1.0 if correct, −1.0 if not.

Equivalence is decided twice, the first that says yes wins: (1) the normalised strings are
equal (:func:`normalize_final_answer`: units, ``\text{}``, spacing commands, ``\dfrac``, dollar
signs, thousands separators, ``x =``); (2) ``math-verify`` parses both sides with sympy and
compares them (``0.5`` = ``\frac{1}{2}`` = ``1/2``, ``\frac{\sqrt2}{2}`` = ``\frac{1}{\sqrt2}``,
sets in any order, ``x = 3`` = ``3``). Unlike verl's ``math_dapo`` (string match only), step (2)
also runs there, so an equal value written differently is not penalised. Every result carries
``acc`` (1.0/0.0) and ``pred`` (the extracted answer, for maj@N).

The parser has no timeout of its own here (its signal-based one needs the main thread); the
reward manager's per-item timeout bounds it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from hybridflow.reward.scorers.boxed import last_boxed

MATH_DAPO_TAIL_CHARS = 300  # the longest MATH-500 answer has 159 characters
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_THOUSANDS = re.compile(r"\d{1,3}(,\d{3})+")

# Words and marks that carry no value in a final answer (verl's list, as facts).
_UNIT_WORDS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
)
_MARKS: tuple[str, ...] = (
    "\\ldots",
    "\\dots",
    "\\text{s}",
    "\\text{.}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\!",
    "\\,",
    "\\:",
    "\\left",
    "\\right",
)


def normalize_final_answer(answer: str) -> str:
    r"""A canonical string for a final answer (``"x = \$1{,}000\text{ cents}"`` → ``"1000"``)."""
    s = answer.split("=")[-1]
    for before, after in (
        ("an ", ""),
        ("a ", ""),
        (".$", "$"),
        ("\\$", ""),
        (r"\ ", ""),
        (" ", ""),
        ("mbox", "text"),
        (",\\text{and}", ","),
        ("\\text{and}", ","),
        ("\\text{m}", "\\text{}"),
    ):
        s = s.replace(before, after)
    for mark in _MARKS:
        s = s.replace(mark, "")
    for word in _UNIT_WORDS:
        s = s.replace(word, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)
    for command in ("text", "textbf", "overline", "mathrm"):
        s = re.sub(rf"\\{command}\{{(.*?)\}}", r"\1", s)
    boxed = last_boxed(s)
    s = boxed if boxed is not None else s
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac([^{\\])(.)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt([^{\\])", r"\\sqrt{\1}", s)
    s = s.replace("$", "").strip().rstrip(".")
    if _THOUSANDS.fullmatch(s):  # 1,000 → 1000, but 1,2 stays a list
        s = s.replace(",", "")
    return s


def equivalent(pred: str | None, truth: str) -> bool:
    """True when ``pred`` and ``truth`` normalise to the same string or math-verify finds them equal."""
    if pred is None:
        return False
    if normalize_final_answer(pred) == normalize_final_answer(truth):
        return True
    return _math_verify_equal(pred, truth)


def _math_verify_equal(pred: str, truth: str) -> bool:
    from math_verify import (  # imported lazily: it pulls in sympy and an ANTLR parser
        parse,
        verify,
    )

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice, per call
    gold = parse(_as_latex(truth), parsing_timeout=None)
    guess = parse(_as_latex(pred), parsing_timeout=None)
    if not gold or not guess:
        return False
    try:
        return bool(verify(gold, guess, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input; unparseable means "not equal"
        return False


def _as_latex(answer: str) -> str:
    text = answer.strip()
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def _ground_truth(ground_truth: Any) -> str:
    text = str(ground_truth[0] if isinstance(ground_truth, (list, tuple)) and ground_truth else ground_truth)
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


def compute_score_boxed(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    r"""``{"score": 1.0 | 0.0, "acc", "pred"}``: the last ``\boxed{}`` against the ground truth."""
    pred = last_boxed(solution_str)
    correct = equivalent(pred, _ground_truth(ground_truth))
    return {"score": float(correct), "acc": float(correct), "pred": "" if pred is None else pred}


def extract_dapo_answer(solution_str: str) -> str | None:
    r"""The last ``Answer: ...`` in the response's last 300 characters, else its last ``\boxed{}``."""
    tail = solution_str[-MATH_DAPO_TAIL_CHARS:]
    lines = _ANSWER_LINE.findall(tail)
    if lines:
        return lines[-1].strip()
    return last_boxed(tail)


def compute_score_dapo(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """``{"score": +1.0 | −1.0, "acc": 1.0 | 0.0, "pred"}`` in verl's math_dapo style."""
    pred = extract_dapo_answer(solution_str)
    correct = equivalent(pred, _ground_truth(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": "" if pred is None else pred}
