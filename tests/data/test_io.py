from __future__ import annotations

import pytest

from hybridflow.data.io import DataFileError, read_rows, write_rows

ROWS = [
    {"data_source": "a", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"style": "rule", "ground_truth": {"target": 3, "numbers": [1, 2]}}},
    {"data_source": "b", "prompt": [{"role": "user", "content": "yo"}], "reward_model": {"style": "rule", "ground_truth": {"target": 5, "numbers": [2, 3]}}},
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip_keeps_nested_values(tmp_path, suffix):
    path = write_rows(ROWS, tmp_path / f"rows{suffix}")
    assert read_rows(path) == ROWS
    assert [p.name for p in tmp_path.iterdir()] == [f"rows{suffix}"]  # no temporary file left behind


def test_unknown_suffix_is_rejected(tmp_path):
    with pytest.raises(DataFileError, match=r"unsupported data file type '\.csv'"):
        read_rows(tmp_path / "x.csv")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataFileError, match="nope.jsonl: data file not found"):
        read_rows(tmp_path / "nope.jsonl")


def test_bad_json_line_names_row_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(DataFileError, match=r"bad.jsonl: row 1 \(line 3\): invalid JSON"):
        read_rows(path)


def test_non_object_json_line(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(DataFileError, match="row 0 .*expected a JSON object, got list"):
        read_rows(path)


def test_write_requires_same_keys(tmp_path):
    with pytest.raises(DataFileError, match="row 1 has keys"):
        write_rows([{"a": 1}, {"b": 2}], tmp_path / "x.parquet")
    with pytest.raises(DataFileError, match="empty"):
        write_rows([], tmp_path / "x.jsonl")
