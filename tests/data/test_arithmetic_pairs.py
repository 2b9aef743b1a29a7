"""Built-in task ``arithmetic-pairs``: correct chosen / wrong rejected under the arithmetic scorer,
same style on both sides, the arithmetic task's prompts minus its test problems, determinism."""

from __future__ import annotations

from collections import Counter

import pytest

from hybridflow.data import read_rows
from hybridflow.data.tasks import TASKS
from hybridflow.data.tasks.arithmetic import (
    DATA_SOURCE,
    DEFAULT_INSTRUCTION,
    extract_answer,
)
from hybridflow.data.tasks.arithmetic_pairs import STYLES, wrong_answers
from hybridflow.entrypoints.data import build_parser, main
from hybridflow.reward.scorers import default_compute_score


def build(*argv: str):
    args = build_parser().parse_args(["arithmetic-pairs", "--out", "unused", *argv])
    return TASKS.get("arithmetic-pairs").build(args)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The default task (1000 train, 200 test pairs) as written by ``hybridflow data``."""
    out = tmp_path_factory.mktemp("pairs")
    assert main(["arithmetic-pairs", "--out", str(out)]) == 0
    return read_rows(out / "train.parquet"), read_rows(out / "test.jsonl")


def test_chosen_scores_1_and_rejected_0_for_every_row(written):
    train, test = written
    assert (len(train), len(test)) == (1000, 200)
    for row in train + test:
        assert row["data_source"] == DATA_SOURCE
        assert default_compute_score(row["data_source"], row["chosen"], row["ground_truth"])["score"] == 1.0
        assert default_compute_score(row["data_source"], row["rejected"], row["ground_truth"])["score"] == 0.0


def test_both_replies_share_a_style_and_differ_only_in_the_answer(written):
    train, _ = written
    for row in train:
        extra = row["extra_info"]
        render = STYLES[extra["style"]]
        wrong, _ = extract_answer(row["rejected"])
        assert row["chosen"] == render(extra["expression"], row["ground_truth"])
        assert row["rejected"] == render(extra["expression"], wrong)
        assert int(wrong) in wrong_answers(extra["expression"], int(row["ground_truth"]))[extra["error"]]
    styles, errors = Counter(r["extra_info"]["style"] for r in train), Counter(r["extra_info"]["error"] for r in train)
    assert set(styles) == set(STYLES) and min(styles.values()) > 1000 / len(STYLES) * 0.7  # drawn uniformly
    assert set(errors) == {"off_by_one", "off_by_ten", "swapped_digits", "dropped_carry", "wrong_operation"}


def test_prompts_are_the_arithmetic_prompts_without_its_test_problems(written):
    train, test = written
    arith_train, arith_test = TASKS.get("arithmetic").build(build_parser().parse_args(["arithmetic", "--out", "x"]))
    for row in train[:5]:
        question = f"What is {row['extra_info']['expression']}? {DEFAULT_INSTRUCTION}"
        assert row["prompt"] == [{"role": "user", "content": question}]
    prompt = lambda row: row["prompt"][0]["content"]  # noqa: E731
    pair_train = {prompt(r) for r in train}
    assert len(pair_train) == 1000 and not pair_train & {prompt(r) for r in test}
    assert not pair_train & {prompt(r) for r in arith_test}  # default settings: 200 test problems, seed 0
    assert prompt(train[0]) != prompt(arith_train[0])  # another random stream than the arithmetic task's


def test_generation_is_deterministic_given_the_seed():
    assert build("--train-size", "30", "--test-size", "10") == build("--train-size", "30", "--test-size", "10")
    assert build("--train-size", "30", "--seed", "1") != build("--train-size", "30", "--seed", "2")


def test_wrong_answers_by_kind():
    assert wrong_answers("23 + 45", 68) == {
        "off_by_one": [67, 69], "off_by_ten": [58, 78], "swapped_digits": [86], "wrong_operation": [-22, 1035],
    }  # no carry to drop in 23 + 45
    assert wrong_answers("58 + 67", 125)["dropped_carry"] == [15]  # 5+6 → 1, 8+7 → 5
    assert wrong_answers("52 - 37", 15)["dropped_carry"] == [25]  # |5-3| = 2, |2-7| = 5: the borrow dropped
    assert "swapped_digits" not in wrong_answers("50 + 16", 66)
    assert wrong_answers("3 * 4 - 2", 10)["wrong_operation"] == [-3, 5, 14, 24]  # one operator changed, precedence kept


def test_other_settings_and_a_small_problem_space(tmp_path):
    train, test = build("--digits", "1", "--ops", "+-*", "--train-size", "40", "--test-size", "20",
                        "--exclude-test-size", "20")
    for row in train + test:
        assert default_compute_score(DATA_SOURCE, row["chosen"], row["ground_truth"])["score"] == 1.0
        assert default_compute_score(DATA_SOURCE, row["rejected"], row["ground_truth"])["score"] == 0.0
    assert main(["arithmetic-pairs", "--out", str(tmp_path), "--digits", "1"]) == 2  # 200 problems to leave out of 100
