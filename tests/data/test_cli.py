from __future__ import annotations

import json

from hybridflow.data.io import read_rows
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.entrypoints.data import main


def test_arithmetic_cli_writes_four_files(tmp_path, tokenizer, capsys):
    out = tmp_path / "arith"
    code = main(["arithmetic", "--out", str(out), "--train-size", "12", "--test-size", "4", "--digits", "1", "--ops", "+-"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "test.parquet", "train.jsonl", "train.parquet"]
    assert read_rows(out / "train.parquet") == read_rows(out / "train.jsonl")
    rows = read_rows(out / "test.jsonl")
    assert len(rows) == 4 and all(0 <= int(x) <= 9 for r in rows for x in r["extra_info"]["expression"].split()[::2])
    assert "12 train rows, 4 test rows" in capsys.readouterr().out
    assert len(RLDataset(out / "train.parquet", tokenizer, max_prompt_length=64)) == 12


def test_countdown_cli(tmp_path):
    assert main(["countdown", "--out", str(tmp_path), "--train-size", "3", "--test-size", "2", "--num-numbers", "4"]) == 0
    assert [len(r["reward_model"]["ground_truth"]["numbers"]) for r in read_rows(tmp_path / "train.parquet")] == [4, 4, 4]


def test_gsm8k_cli_from_a_folder(tmp_path):
    src = tmp_path / "gsm8k"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps({"question": f"{split} q?", "answer": "so\n#### 5"}) + "\n")
    assert main(["gsm8k", "--src", str(src), "--out", str(tmp_path / "out")]) == 0
    rows = read_rows(tmp_path / "out" / "test.parquet")
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert rows[0]["extra_info"]["split"] == "test"


def test_cli_errors_are_reported(tmp_path, capsys):
    assert main(["gsm8k", "--out", str(tmp_path)]) == 2
    assert "needs --src DIR or both --train and --test" in capsys.readouterr().err
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    assert main(["gsm8k", "--train", str(bad), "--test", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "train.jsonl: row 0: field 'answer'" in capsys.readouterr().err


def test_prompt_template_wraps_every_question(tmp_path):
    out = tmp_path / "plain"
    args = ["arithmetic", "--out", str(out), "--train-size", "3", "--test-size", "2", "--digits", "1"]
    assert main([*args, "--instruction", "", "--prompt-template", "Q: {question}\\nA: {x}"]) == 0
    for split in ("train", "test"):
        for row in read_rows(out / f"{split}.parquet"):
            content = row["prompt"][0]["content"]
            expression = row["extra_info"]["expression"]
            assert content == f"Q: What is {expression}?\nA: {{x}}"  # other braces stay literal


def test_prompt_template_without_the_placeholder_is_refused(tmp_path, capsys):
    assert main(["arithmetic", "--out", str(tmp_path), "--prompt-template", "Question:"]) == 2
    assert "must contain '{question}' exactly once" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
