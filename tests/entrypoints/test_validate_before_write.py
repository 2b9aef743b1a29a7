"""``hybridflow sft`` / ``train`` validate the data before writing anything: a bad training file
fails before a missing built-in task is written into ``~/data/hybridflow``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hybridflow.config import load_config, load_sft_config
from hybridflow.data import write_rows
from hybridflow.data.tasks import ArithmeticSettings, generate_arithmetic
from hybridflow.data.tasks.arithmetic_sft import add_responses
from hybridflow.entrypoints import common, train
from hybridflow.entrypoints.sft import build_sft_loaders
from hybridflow.entrypoints.sft import main as sft_main
from hybridflow.models import load_tokenizer


@pytest.fixture
def builtin_root(tmp_path, monkeypatch) -> Path:
    """Where built-in tasks are written on first use (``~/data/hybridflow``), inside tmp_path."""
    root = tmp_path / "data" / "hybridflow"
    monkeypatch.setattr(common, "BUILTIN_DATA_ROOT", root)
    return root


def _sft_args(model_dir: Path, train: str, val: str, run_dir: Path) -> list[str]:
    return [f"model.path={model_dir}", f"data.train_files=[{train}]", f"data.val_files=[{val}]",
            "data.max_length=96", "data.train_batch_size=4", f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[jsonl]", "trainer.total_training_steps=1"]


def test_sft_with_a_missing_train_file_writes_nothing(builtin_root, tiny_model_dir, tmp_path, capsys):
    val = builtin_root / "arithmetic-sft" / "test.parquet"  # the default: would be written on first use
    args = _sft_args(tiny_model_dir, str(tmp_path / "typo.parquet"), str(val), tmp_path / "run")
    assert sft_main(args) == 2
    assert f"data.train_files: {tmp_path / 'typo.parquet'} does not exist" in capsys.readouterr().err
    assert not builtin_root.exists() and not (tmp_path / "run").exists()


def test_sft_with_a_malformed_train_file_writes_nothing(builtin_root, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"question": ["1+1"], "answer": ["2"]}).to_parquet(bad)  # not the prompt/response columns
    val = builtin_root / "arithmetic-sft" / "test.parquet"
    assert sft_main(_sft_args(tiny_model_dir, str(bad), str(val), tmp_path / "run")) == 2
    assert "bad.parquet: row 0: field 'prompt': missing column" in capsys.readouterr().err
    assert not builtin_root.exists() and not (tmp_path / "run").exists()


def test_a_missing_builtin_task_is_written_once_the_user_files_are_valid(builtin_root, tiny_model_dir, tmp_path):
    rows = add_responses(generate_arithmetic(8, 0, seed=0, settings=ArithmeticSettings(min_value=0, max_value=9))[0])
    val = write_rows(rows, tmp_path / "val.parquet")
    train = builtin_root / "arithmetic-sft" / "train.parquet"
    config = load_sft_config(None, _sft_args(tiny_model_dir, str(train), str(val), tmp_path / "run"))
    train_loader, val_loader = build_sft_loaders(config, load_tokenizer(str(tiny_model_dir)))
    assert train.is_file() and len(train_loader) > 0 and val_loader is not None


def test_train_checks_its_data_files_before_writing(builtin_root, tiny_model_dir, tmp_path):
    config = load_config(None, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                f"data.train_files=[{tmp_path / 'typo.parquet'}]",
                                f"data.val_files=[{builtin_root / 'arithmetic' / 'test.parquet'}]"])
    with pytest.raises(FileNotFoundError, match="data.train_files: .*typo.parquet does not exist"):
        train.build_loaders(config, load_tokenizer(str(tiny_model_dir)))
    assert not builtin_root.exists()
