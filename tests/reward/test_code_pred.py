"""The code scorer returns ``pred``, the extracted program, like every built-in scorer."""

from __future__ import annotations

import json

from hybridflow.reward.scorers.code import CodeSandboxSpec, compute_score

CALL_TESTS = json.dumps({"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]})
SPEC = CodeSandboxSpec(timeout_s=3, allow_weak_isolation=True)


def test_no_code_gives_an_empty_pred():
    result = compute_score("I would add them.", CALL_TESTS, sandbox=SPEC)
    assert (result["pred"], result["status"], result["score"]) == ("", "no_code", 0.0)


def test_pred_is_the_program_that_was_graded():
    text = "```python\nprint(add(1, 2))\n```\nand\n```python\ndef add(a, b) return a\n```\n```python\nadd(1)\n```"
    result = compute_score(text, CALL_TESTS, sandbox=SPEC)
    # the last block defining fn_name is graded (and does not compile), not the last block
    assert result["pred"] == "def add(a, b) return a\n"
    assert result["status"] == "compile_error: SyntaxError" and result["score"] == 0.0
