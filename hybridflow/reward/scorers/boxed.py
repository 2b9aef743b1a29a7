r"""Scorer for MATH-style data sources: the last ``\boxed{...}`` against the ground truth.

The answer is the content of the last ``\boxed{...}`` (or ``\fbox{...}``, or ``\boxed x``)
in the response; a ground truth that is itself boxed is unwrapped the same way. Both are
normalised (:func:`normalize_answer`) and compared as strings; if both normalise to plain
numbers they are compared as numbers. Equal → 1.0, else 0.0 (also when nothing is boxed).
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.data.tasks.answers import parse_number

_BOX_COMMANDS: tuple[str, ...] = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` / ``\fbox{...}`` (braces balanced) or ``\boxed x``; None if none."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(cmd for cmd in _BOX_COMMANDS if text.startswith(cmd, start))
    rest = text[start + len(command) :]
    if rest.startswith(" "):  # "\boxed 5": the argument runs to the next "$" or whitespace
        return rest.strip().split("$", 1)[0].split()[0] if rest.strip() else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced braces


def _unwrap_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)


def _fix_fracs(s: str) -> str:
    # \frac12 → \frac{1}{2}, \frac1{2} → \frac{1}{2}; \sqrt2 → \sqrt{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def normalize_answer(answer: str) -> str:
    r"""A canonical string for an answer: ``"\dfrac{1}{2}"``, ``"1/2"`` and ``"\frac12"`` → ``"\frac{1}{2}"``.

    Removes spacing commands, ``\left``/``\right``, ``$``, degree marks, percent signs, text
    wrappers and a leading ``x =``; unifies ``\dfrac``/``\tfrac`` to ``\frac``; drops all
    spaces and a trailing period; writes ``.5`` as ``0.5`` and integer ratios ``a/b`` as fractions.
    """
    s = answer.strip().replace("\n", "")
    s = _unwrap_text(s)
    for old, new in (
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\left", ""),
        ("\\right", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\%", ""),
        ("%", ""),
    ):
        s = s.replace(old, new)
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"[a-zA-Z]=.+", s):
        s = s.split("=", 1)[1]
    if s.startswith("."):
        s = "0" + s
    s = _fix_fracs(s)
    ratio = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if ratio:
        s = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    return s


def is_equiv(a: str, b: str) -> bool:
    """Equal after :func:`normalize_answer`, or equal as numbers."""
    na, nb = normalize_answer(a), normalize_answer(b)
    if na == nb:
        return True
    va, vb = parse_number(na), parse_number(nb)
    return va is not None and va == vb


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """1.0 if the last boxed answer is equivalent to the ground truth, else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    truth = last_boxed(truth) or truth
    return 1.0 if is_equiv(answer, truth) else 0.0
