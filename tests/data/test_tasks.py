from __future__ import annotations

import json
import random

import pytest

from hybridflow.data.schema import DataRowError, validate_rl_row
from hybridflow.data.tasks import TASKS, ArithmeticSettings, CountdownSettings, generate_arithmetic, generate_countdown
from hybridflow.data.tasks.arithmetic import digits_range, make_problem
from hybridflow.data.tasks.expr import ExpressionError, evaluate_expression, expression_numbers
from hybridflow.data.tasks.gsm8k import convert_gsm8k_rows, extract_gsm8k_answer, find_split_file


def test_registry_lists_the_tasks():
    assert TASKS.names() == ["arithmetic", "arithmetic-pairs", "arithmetic-sft", "code-convert", "code-functions", "countdown", "gsm8k", "shapes", "tool-lookup"]
    with pytest.raises(ValueError, match="valid names: arithmetic, arithmetic-pairs, arithmetic-sft, code-convert, code-functions, countdown, gsm8k, shapes, tool-lookup"):
        TASKS.get("sudoku")


def test_expression_evaluator():
    assert evaluate_expression("(3 + 5) / 2") == 4
    assert evaluate_expression("7 / 2 * 2") == 7  # exact, not 7.000001
    assert evaluate_expression("2 + 3 * 4") == 14
    assert expression_numbers("(12 + 3) * 4") == [12, 3, 4]
    for bad in ("", "2 ** 3", "-2 + 3", "__import__('os')", "1.5 + 1", "3 / (2 - 2)", "2 +", "abs(3)"):
        with pytest.raises(ExpressionError):
            evaluate_expression(bad)


def test_digits_range():
    assert digits_range(1) == (0, 9) and digits_range(2) == (10, 99) and digits_range(3) == (100, 999)


def test_arithmetic_rows_are_correct_and_in_schema():
    train, test = generate_arithmetic(50, 20, seed=3, settings=ArithmeticSettings(ops=("+", "-", "*")))
    assert (len(train), len(test)) == (50, 20)
    for i, row in enumerate(train + test):
        parsed = validate_rl_row(row, file="gen", row_index=i)
        expression = row["extra_info"]["expression"]
        a, op, b = expression.split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert row["reward_model"]["ground_truth"] == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
        assert f"What is {expression}?" in parsed.messages[0]["content"] and "####" in parsed.messages[0]["content"]
    assert [r["extra_info"]["index"] for r in test] == list(range(20))
    assert {r["extra_info"]["split"] for r in train} == {"train"}
    train_exprs = {r["extra_info"]["expression"] for r in train}
    assert len(train_exprs) == 50 and not train_exprs & {r["extra_info"]["expression"] for r in test}


def test_arithmetic_is_seeded():
    assert generate_arithmetic(5, 5, seed=1) == generate_arithmetic(5, 5, seed=1)
    assert generate_arithmetic(5, 5, seed=1) != generate_arithmetic(5, 5, seed=2)


def test_arithmetic_knobs():
    rng = random.Random(0)
    no_negative = ArithmeticSettings(min_value=0, max_value=9, ops=("-",), allow_negative=False)
    assert all(make_problem(rng, no_negative)[1] >= 0 for _ in range(200))
    three = ArithmeticSettings(min_value=1, max_value=5, ops=("*",), num_operands=3)
    expression, answer = make_problem(rng, three)
    assert len(expression.split()) == 5 and answer == evaluate_expression(expression)
    with pytest.raises(ValueError, match="ops must be"):
        ArithmeticSettings(ops=("/",))
    with pytest.raises(ValueError, match="distinct problems"):
        generate_arithmetic(200, 0, settings=ArithmeticSettings(min_value=0, max_value=3))


def test_countdown_problems_are_solvable():
    train, test = generate_countdown(30, 10, seed=0, settings=CountdownSettings(num_numbers=4))
    for row in train + test:
        truth = row["reward_model"]["ground_truth"]
        solution = row["extra_info"]["solution"]
        assert sorted(expression_numbers(solution)) == sorted(truth["numbers"])
        assert evaluate_expression(solution) == truth["target"]
        assert 1 <= truth["target"] <= 100 and len(truth["numbers"]) == 4
        assert str(truth["target"]) in row["prompt"][0]["content"]
    keys = lambda rows: {(tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])), r["reward_model"]["ground_truth"]["target"]) for r in rows}
    assert not keys(train) & keys(test)


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 and a bike $300. Total?", "answer": "1200+300=1500\n#### 1,500"},
]


def test_gsm8k_conversion():
    rows = convert_gsm8k_rows(GSM8K_ROWS, split="test", file="test.jsonl")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1500"]
    assert rows[1]["data_source"] == "openai/gsm8k"
    assert rows[0]["prompt"][0]["content"].startswith("Tom has 3 apples and buys 4. How many? ")
    assert rows[1]["extra_info"] == {"split": "test", "index": 1, **GSM8K_ROWS[1]}
    assert extract_gsm8k_answer("x #### 12 ") == "12"


@pytest.mark.parametrize(
    "row, field, problem",
    [({"question": "q"}, "answer", "missing column"), ({"question": "q", "answer": "no marker"}, "answer", "no '####'"),
     ({"question": "", "answer": "#### 1"}, "question", "non-empty string")],
)
def test_gsm8k_bad_rows(row, field, problem):
    with pytest.raises(DataRowError, match=rf"src.jsonl: row 1: field '{field}': .*{problem}"):
        convert_gsm8k_rows([GSM8K_ROWS[0], row], split="train", file="src.jsonl")


def test_find_split_file(tmp_path):
    nested = tmp_path / "main"
    nested.mkdir()
    (nested / "train-00000-of-00001.parquet").write_text("")
    (tmp_path / "test.jsonl").write_text(json.dumps(GSM8K_ROWS[0]) + "\n")
    assert find_split_file(tmp_path, "train") == nested / "train-00000-of-00001.parquet"
    assert find_split_file(tmp_path, "test") == tmp_path / "test.jsonl"
    with pytest.raises(FileNotFoundError, match="no GSM8K validation file"):
        find_split_file(tmp_path, "validation")
