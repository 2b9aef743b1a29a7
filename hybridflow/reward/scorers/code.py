"""Code rewards: the response's program runs against the row's test cases in the sandbox.

Ground truth (verl's code datasets: ``codecontests``, ``apps``, ``codeforces``, ``taco``, and
the built-in ``hybridflow/code-functions``) is a dict or its JSON string::

    {"inputs": [...], "outputs": [...]}                    # stdin → stdout programs
    {"fn_name": "f", "inputs": [[1, 2], ...], "outputs": [3, ...]}   # call-based

Stdin cases pass when the program's stdout equals the expected output up to trailing
whitespace on each line and at the end. Call-based cases call ``fn_name(*args)`` (or
``Solution().fn_name`` when only a class defines it) and pass when the JSON of the result
equals the expected value (APPS's ``[value]`` wrapping is accepted too).

The program is the last fenced ```python (or plain ```) block of the response — for call-based
cases the last one that defines ``fn_name``, since models often add a block of example calls;
a response without one scores 0 (``no_code``). A program that does not compile scores 0 without running
the cases. Each case is one sandboxed run (:mod:`hybridflow.sandbox`) with a wall-clock limit;
the cases of one response run concurrently. The score is the fraction of cases passed, or 1/0
with ``all_or_nothing``; the result also carries ``acc`` (all passed), ``pred`` (the extracted
program, ``""`` without one, as the other scorers' extracted answer), ``passed``, ``total`` and
``verdicts`` (one letter per case: ``P`` passed, ``F`` wrong answer, ``E`` error exit, ``T``
time limit, ``O`` output limit, ``S`` sandbox error).

A sandbox that cannot be reached raises (the reward manager counts the item as an error and
logs the URL), so an outage never looks like a wrong answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hybridflow.data.tasks.code_functions import parse_code_tests
from hybridflow.sandbox.client import FusionSandbox, LocalSandbox, SandboxClient
from hybridflow.sandbox.executor import (
    FINISHED,
    OUTPUT_LIMIT,
    SANDBOX_ERROR,
    TIME_LIMIT,
    RunResult,
)
from hybridflow.sandbox.limits import SandboxLimits

VERL_CODE_SOURCES: tuple[str, ...] = ("codecontests", "apps", "codeforces", "taco")
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_CALL_HARNESS = """

import json as _hf_json, sys as _hf_sys
_hf_name = {name!r}
_hf_fn = globals().get(_hf_name)
if _hf_fn is None and "Solution" in globals():
    _hf_fn = getattr(globals()["Solution"](), _hf_name)
if _hf_fn is None:
    raise SystemExit("no function named " + _hf_name)
print(_hf_json.dumps(_hf_fn(*_hf_json.loads(_hf_sys.stdin.read()))))
"""


@dataclass(frozen=True)
class CodeSandboxSpec:
    """Where and how test cases run; picklable, so it reaches the scorer processes."""

    url: str | None = None
    max_concurrent: int = 4
    memory_limit_mb: int = 1024
    timeout_s: float = 5.0
    all_or_nothing: bool = False
    allow_weak_isolation: bool = False
    token: str | None = field(default=None, repr=False)  # the trainer's own `hybridflow sandbox` child's


@lru_cache(maxsize=8)
def scorer_process(spec: CodeSandboxSpec) -> SandboxClient:
    """One client per spec and process (the local sandbox detects its isolation once)."""
    if spec.url:
        return FusionSandbox(
            spec.url,
            max_concurrent=spec.max_concurrent,
            memory_mb=spec.memory_limit_mb,
            timeout_s=spec.timeout_s,
            token=spec.token,
        )
    limits = SandboxLimits(wall_s=spec.timeout_s, memory_mb=spec.memory_limit_mb)
    return LocalSandbox(
        limits,
        max_concurrent=spec.max_concurrent,
        allow_weak_isolation=spec.allow_weak_isolation,
        what="the code reward",
    )


def extract_code(response: str, fn_name: str | None = None) -> str | None:
    """The last fenced python block (without one, the last fenced block of any language tag).
    With ``fn_name``, the last such block that defines it, if one does: models often end with
    a second block of example calls."""
    blocks = _FENCE.findall(response)
    candidates = [body for tag, body in blocks if tag.lower() in ("python", "py", "python3")] or [b for _, b in blocks]
    if fn_name:
        defining = [b for b in candidates if re.search(rf"\bdef\s+{re.escape(fn_name)}\s*\(", b)]
        candidates = defining or candidates
    return candidates[-1] if candidates else None


def _same_stdout(actual: str, expected: Any) -> bool:
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in str(text).rstrip().splitlines()]

    return norm(actual) == norm(expected if isinstance(expected, str) else "\n".join(map(str, expected)))


def _same_value(stdout: str, expected: Any) -> bool:
    lines = stdout.strip().splitlines()
    if not lines:
        return False
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return False
    return value == expected or [value] == expected


def _verdict(result: RunResult, passed: bool) -> str:
    if result.status == FINISHED:
        return "P" if passed else ("F" if result.return_code == 0 else "E")
    return {TIME_LIMIT: "T", OUTPUT_LIMIT: "O", SANDBOX_ERROR: "S"}.get(result.status, "S")


async def _run_cases(client: SandboxClient, program: str, tests: dict[str, Any], timeout_s: float) -> str:
    name = tests.get("fn_name")
    if name:
        program = program + _CALL_HARNESS.format(name=str(name))
        stdins = [json.dumps(args if isinstance(args, list) else [args]) for args in tests["inputs"]]
    else:
        stdins = [x if isinstance(x, str) else "\n".join(map(str, x)) for x in tests["inputs"]]
    results = await asyncio.gather(*(client.run(program, stdin=s, timeout_s=timeout_s) for s in stdins))
    verdicts = []
    for result, expected in zip(results, tests["outputs"], strict=True):
        ok = result.passed and (_same_value(result.stdout, expected) if name else _same_stdout(result.stdout, expected))
        verdicts.append(_verdict(result, ok))
    if "S" in verdicts:
        bad = next(r for r in results if _verdict(r, False) == "S")
        raise RuntimeError(f"the sandbox failed to run a test case: {bad.stderr[:300]}")
    return "".join(verdicts)


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, sandbox: CodeSandboxSpec | None = None
) -> dict[str, Any]:
    """Score one response (rules: module docstring)."""
    spec = sandbox or CodeSandboxSpec()
    tests = parse_code_tests(ground_truth)
    total = len(tests["inputs"])
    program = extract_code(solution_str, tests.get("fn_name"))
    if program is None:
        return {"score": 0.0, "acc": 0.0, "pred": "", "passed": 0, "total": total, "verdicts": "", "status": "no_code"}
    try:
        compile(program, "main.py", "exec")
    except (SyntaxError, ValueError) as exc:
        return {
            "score": 0.0,
            "acc": 0.0,
            "pred": program,
            "passed": 0,
            "total": total,
            "verdicts": "",
            "status": f"compile_error: {type(exc).__name__}",
        }
    verdicts = asyncio.run(_run_cases(scorer_process(spec), program, tests, spec.timeout_s))
    passed = verdicts.count("P")
    fraction = passed / total
    score = float(passed == total) if spec.all_or_nothing else fraction
    return {
        "score": score,
        "acc": float(passed == total),
        "pred": program,
        "passed": passed,
        "total": total,
        "verdicts": verdicts,
        "status": "ran",
    }
