"""The code scorer: extraction, stdin and call-based cases in the sandbox, verdicts, the task."""

from __future__ import annotations

import json

import pytest

from hybridflow.data.tasks.code_functions import (
    DATA_SOURCE,
    FAMILIES,
    CodeRowError,
    convert_code_row,
    generate_code_functions,
)
from hybridflow.reward.scorers import default_compute_score
from hybridflow.reward.scorers.code import CodeSandboxSpec, compute_score, extract_code
from hybridflow.sandbox.client import SandboxUnavailableError

SPEC = CodeSandboxSpec(timeout_s=3, allow_weak_isolation=True)
STDIN_TESTS = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7", "0\n"]}
CALL_TESTS = json.dumps({"fn_name": "add", "inputs": [[1, 2], [10, -3], [0, 0]], "outputs": [3, 7, [0]]})


def fenced(code: str, tag: str = "python") -> str:
    return f"Here it is:\n```{tag}\n{code}\n```\nDone."


def test_extract_the_last_python_block():
    text = "```\nfirst\n```\n```python\nsecond\n```\n```text\nthird\n```"
    assert extract_code(text) == "second\n"
    assert extract_code("```\nonly plain\n```") == "only plain\n"
    assert extract_code("def f(): pass") is None
    with_usage = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(with_usage) == "print(add(1, 2))\n"
    assert extract_code(with_usage, "add") == "def add(a, b):\n    return a + b\n"


def test_stdin_programs_score_the_fraction_passed():
    right = fenced("a, b = map(int, input().split())\nprint(a + b)")
    wrong_one = fenced("a, b = map(int, input().split())\nprint(a + b if a else 1)")
    assert compute_score(right, STDIN_TESTS, sandbox=SPEC) == {
        "score": 1.0, "acc": 1.0, "pred": "a, b = map(int, input().split())\nprint(a + b)\n", "passed": 3, "total": 3,
        "verdicts": "PPP", "status": "ran"}
    partial = compute_score(wrong_one, STDIN_TESTS, sandbox=SPEC)
    assert partial["score"] == pytest.approx(2 / 3) and partial["verdicts"] == "PPF" and partial["acc"] == 0.0
    strict = compute_score(wrong_one, STDIN_TESTS, sandbox=CodeSandboxSpec(timeout_s=3, all_or_nothing=True,
                                                                          allow_weak_isolation=True))
    assert strict["score"] == 0.0 and strict["passed"] == 2


def test_call_based_cases_accept_apps_wrapping_and_a_solution_class():
    assert compute_score(fenced("def add(a, b):\n    return a + b"), CALL_TESTS, sandbox=SPEC)["verdicts"] == "PPP"
    leet = fenced("class Solution:\n    def add(self, a, b):\n        return a + b")
    assert compute_score(leet, CALL_TESTS, sandbox=SPEC)["score"] == 1.0


def test_errors_timeouts_and_compile_errors_score_zero():
    crash = compute_score(fenced("def add(a, b):\n    raise ValueError"), CALL_TESTS, sandbox=SPEC)
    assert crash["verdicts"] == "EEE" and crash["score"] == 0.0
    slow = compute_score(fenced("def add(a, b):\n    while True: pass"), CALL_TESTS,
                         sandbox=CodeSandboxSpec(timeout_s=1, allow_weak_isolation=True))
    assert slow["verdicts"] == "TTT" and slow["score"] == 0.0
    broken = compute_score(fenced("def add(a, b) return a"), CALL_TESTS, sandbox=SPEC)
    assert broken["score"] == 0.0 and broken["status"].startswith("compile_error") and broken["verdicts"] == ""
    none = compute_score("I think the answer is a + b.", CALL_TESTS, sandbox=SPEC)
    assert none["status"] == "no_code" and none["score"] == 0.0 and none["total"] == 3


def test_a_sandbox_that_is_down_raises_instead_of_scoring_zero():
    spec = CodeSandboxSpec(url="http://127.0.0.1:9", timeout_s=1)
    with pytest.raises(SandboxUnavailableError, match="sandbox http://127.0.0.1:9/run_code is unavailable"):
        compute_score(fenced("def add(a, b):\n    return a + b"), CALL_TESTS, sandbox=spec)


def test_default_compute_score_routes_code_sources_with_the_spec():
    response = fenced("def add(a, b):\n    return a + b")
    for source in ("codecontests", "apps", "taco", "codeforces", DATA_SOURCE):
        assert default_compute_score(source, response, CALL_TESTS, code_sandbox=SPEC)["score"] == 1.0


def test_built_in_task_reference_solutions_pass_and_splits_are_disjoint():
    train, test = generate_code_functions(60, 20, seed=3)
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    assert all(r["data_source"] == DATA_SOURCE for r in train + test)
    row = train[0]
    tests = json.loads(row["reward_model"]["ground_truth"])
    assert tests["fn_name"] == row["extra_info"]["fn_name"] and len(tests["inputs"]) == len(tests["outputs"]) == 4
    assert f"`{tests['fn_name']}(" in row["prompt"][0]["content"] and "```python" in row["prompt"][0]["content"]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_problem_family_has_tests_the_scorer_can_pass(family):
    """Every family's cases are well-formed for the call harness: a lookup table of them passes."""
    import random

    name, _, _, fn, args = family.make(random.Random(1))
    tests = {"fn_name": name, "inputs": args, "outputs": [fn(*a) for a in args]}
    table = {json.dumps(a): o for a, o in zip(tests["inputs"], tests["outputs"])}
    lookup = (f"import json\n_T = {table!r}\ndef {tests['fn_name']}(*args):\n"
              "    return _T[json.dumps(list(args))]")
    assert compute_score(fenced(lookup), json.dumps(tests), sandbox=SPEC)["score"] == 1.0


def test_converter_checks_rows_and_names_the_problem():
    good = {"data_source": "apps", "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"style": "rule", "ground_truth": {"inputs": ["1\n"], "outputs": ["1\n"]}}}
    out = convert_code_row(good, "f: row 0")
    assert json.loads(out["reward_model"]["ground_truth"]) == {"inputs": ["1\n"], "outputs": ["1\n"]}
    for bad, message in [
        ({**good, "reward_model": {"ground_truth": "{not json"}}, "is not JSON"),
        ({**good, "reward_model": {"ground_truth": {"inputs": ["1"], "outputs": []}}}, "1 inputs but 0 outputs"),
        ({k: v for k, v in good.items() if k != "prompt"}, "missing column 'prompt'"),
    ]:
        with pytest.raises(CodeRowError, match=rf"f: row 3: .*{message}"):
            convert_code_row(bad, "f: row 3")


def test_train_refuses_code_rewards_under_weak_isolation_at_start_up(tmp_path, monkeypatch, make_config):
    from hybridflow.data.tasks.common import write_task
    from hybridflow.entrypoints.train import code_sandbox_spec
    from hybridflow.sandbox import isolation as isolation_module
    from hybridflow.sandbox.isolation import RLIMITS, Isolation, IsolationError

    train, test = generate_code_functions(4, 2)
    write_task(train, test, tmp_path)
    files = [f"data.train_files=[{tmp_path / 'train.parquet'}]", f"data.val_files=[{tmp_path / 'test.jsonl'}]"]
    monkeypatch.setattr(isolation_module, "detect_isolation", lambda: Isolation(RLIMITS, "no bubblewrap (test)"))
    with pytest.raises(IsolationError, match=r"the code reward \(reward_model.code.allow_weak_isolation\) runs untrusted"):
        code_sandbox_spec(make_config(*files))
    spec = code_sandbox_spec(make_config(*files, "reward_model.code.allow_weak_isolation=true",
                                         "reward_model.code.timeout_s=2", "reward_model.code.all_or_nothing=true"))
    assert spec.allow_weak_isolation and spec.timeout_s == 2 and spec.all_or_nothing
    # the trainer started a local service for the scorer processes; it answers in Fusion's format
    result = compute_score(fenced("def add(a, b):\n    return a + b"), CALL_TESTS, sandbox=spec)
    assert spec.url.startswith("http://127.0.0.1:") and result["verdicts"] == "PPP"
    remote = code_sandbox_spec(make_config(*files, "reward_model.sandbox_fusion.url=http://127.0.0.1:8080/run_code",
                                           "reward_model.sandbox_fusion.max_concurrent=3"))
    assert remote.url == "http://127.0.0.1:8080/run_code" and remote.max_concurrent == 3  # no local check


def test_reward_manager_scores_code_through_the_local_service(make_batch, tokenizer):
    """As ``hybridflow train`` wires it: the scorer processes send programs to a local
    ``hybridflow sandbox``; an unreachable service is counted in reward/errors, never a silent
    wrong answer."""
    from hybridflow.reward import build_reward_manager
    from hybridflow.sandbox.limits import SandboxLimits
    from hybridflow.sandbox.local_service import LocalSandboxService

    good, bad = fenced("def add(a, b):\n    return a + b"), fenced("def add(a, b):\n    return a - b")
    batch, lengths = make_batch([good, bad], [CALL_TESTS, CALL_TESTS], data_sources=["apps", DATA_SOURCE])
    service = LocalSandboxService(SandboxLimits(wall_s=15), max_concurrent=4, allow_weak_isolation=True)
    # the service's token, as hybridflow train hands it on; timeout generous: the machine may be busy
    spec = CodeSandboxSpec(url=service.url, token=service.token, timeout_s=15)
    manager = build_reward_manager("prime", tokenizer, num_workers=2, timeout_s=60, code_sandbox=spec)
    try:
        reward, info = manager(batch)
    finally:
        manager.close()
        service.close()
    assert reward.sum(-1).tolist() == pytest.approx([1.0, 1 / 3])  # add(0, 0) == 0 passes either way
    assert info["verdicts"] == ["PPP", "FFP"]
    down = build_reward_manager("naive", tokenizer, timeout_s=30,
                                code_sandbox=CodeSandboxSpec(url="http://127.0.0.1:9", timeout_s=1))
    try:
        reward, info = down(batch)
    finally:
        down.close()
    assert reward.sum().item() == 0.0
    assert info["reward_error"] == [1.0, 1.0]


def test_inside_a_scorer_process_bubblewrap_is_not_used(tokenizer):
    """A forked scorer process sits in a PID namespace without its own /proc: detection says
    so instead of letting bubblewrap hang."""
    from hybridflow.reward.executors import ScorerPool
    from hybridflow.reward.scorer_process import ScorerSettings

    pool = ScorerPool(_detect_in_child, 1, load_timeout_s=30, settings=ScorerSettings(memory_limit_mb=4096))
    try:
        [result] = pool.run([{}], 30)
    finally:
        pool.close()
    if pool.isolation == "pid-namespace":
        assert result.value["level"] == "rlimits" and "PID namespace without its own /proc" in result.value["detail"]


def _detect_in_child() -> dict:
    from hybridflow.sandbox.isolation import detect_isolation

    isolation = detect_isolation()
    return {"score": 0.0, "level": isolation.level, "detail": isolation.detail}
