"""The bad-input corpus: every entry point answers bad input with exit code 2 and one clean
message that names the problem — never a traceback (that needs ``HYBRIDFLOW_DEBUG=1``)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hybridflow.data.io import write_rows
from hybridflow.data.tasks.arithmetic import generate_arithmetic
from hybridflow.entrypoints.config import main as config_main
from hybridflow.entrypoints.data import main as data_main
from hybridflow.entrypoints.eval import main as eval_main
from hybridflow.entrypoints.export import main as export_main
from hybridflow.entrypoints.generate import main as generate_main
from hybridflow.entrypoints.plot import main as plot_main
from hybridflow.entrypoints.serve import main as serve_main
from hybridflow.entrypoints.sft import main as sft_main
from hybridflow.entrypoints.train import main as train_main


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of good and bad inputs."""
    d = tmp_path_factory.mktemp("bad_inputs")
    train, test = generate_arithmetic(8, 4, seed=0)
    write_rows(train, d / "train.parquet")
    write_rows(test, d / "test.parquet")
    write_rows(test, d / "no_responses.jsonl")
    (d / "not_json.jsonl").write_text('{"prompt": [{"role": "user", "content": "hi"}]}\nnot json\n')
    (d / "list_row.jsonl").write_text("[1, 2]\n")
    (d / "no_rows.jsonl").write_text("\n\n")
    (d / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    (d / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    (d / "table.csv").write_text("a,b\n1,2\n")
    no_prompt = {k: v for k, v in train[0].items() if k != "prompt"}
    write_rows([no_prompt], d / "no_prompt.jsonl")
    write_rows([{**train[0], "prompt": 5}], d / "int_prompt.jsonl")
    write_rows([{"prompt": "What is 1 + 1?"}], d / "sft_no_response.jsonl")
    (d / "broken.yaml").write_text("data: [unclosed\n")
    (d / "empty_model").mkdir()
    (d / "no_config_model").mkdir()
    (d / "no_config_model" / "model.safetensors").write_bytes(b"not safetensors")
    (d / "run" / "global_step_3").mkdir(parents=True)
    (d / "corrupt_latest").mkdir()
    (d / "corrupt_latest" / "latest_checkpointed_iteration.txt").write_text("three\n")
    (d / "reward_other_name.py").write_text("def other(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    (d / "reward_syntax.py").write_text("def compute_score(:\n")
    (d / "reward_exits.py").write_text("import os\nos._exit(7)\n")
    (d / "tools_missing_class.yaml").write_text("tools:\n  - class_name: hybridflow.tools.calculator.NoSuchTool\n")
    _save_nan_model(d / "nan_model")
    return d


def _save_nan_model(path: Path) -> None:
    """A tiny model whose final norm weight is NaN: it loads, but every logit is NaN."""
    from safetensors.torch import load_file, save_file

    from hybridflow.models.tiny import save_tiny_model

    save_tiny_model(path, arch="llama", seed=0)
    weights = load_file(path / "model.safetensors")
    name = next(k for k in weights if k.endswith("norm.weight") and "layers" not in k)
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def train_args(d: Path, *extra: str) -> list[str]:
    base = {
        "data.train_files": f"[{d / 'train.parquet'}]",
        "data.val_files": f"[{d / 'test.parquet'}]",
        "actor_rollout_ref.model.path": "tiny-llama",
        "trainer.default_local_dir": str(d / "run_out"),
        "trainer.total_training_steps": "1",
    }
    for item in extra:
        key, _, value = item.partition("=")
        base[key] = value
    return [f"{k}={v}" for k, v in base.items()]


def sft_args(d: Path, *extra: str) -> list[str]:
    base = {"data.val_files": "[]", "model.path": "tiny-llama", "trainer.default_local_dir": str(d / "sft_out")}
    for item in extra:
        key, _, value = item.partition("=")
        base[key] = value
    return [f"{k}={v}" for k, v in base.items()]


# name → (entry point, argv built from the folder, substrings the message must contain)
CASES: dict[str, tuple[Callable[[list[str]], int], Callable[[Path], list[str]], tuple[str, ...]]] = {
    # config
    "unknown key": (train_main, lambda d: train_args(d, "trainer.foo=1"), ("trainer.foo", "unknown key")),
    "wrong type": (train_main, lambda d: train_args(d, "data.train_batch_size=abc"), ("data.train_batch_size", "expected int")),
    "out of range": (train_main, lambda d: train_args(d, "actor_rollout_ref.actor.optim.lr=-1"), ("optim.lr", "> 0")),
    "unknown estimator": (train_main, lambda d: train_args(d, "algorithm.adv_estimator=foo"), ("adv_estimator", "valid names", "grpo")),
    "micro-batch does not divide": (
        train_main, lambda d: train_args(d, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
        ("ppo_micro_batch_size_per_gpu=3", "must divide"),
    ),
    "missing config file": (train_main, lambda d: ["--config", str(d / "nope.yaml")], ("nope.yaml",)),
    "malformed config file": (train_main, lambda d: ["--config", str(d / "broken.yaml")], ("broken.yaml",)),
    "config command": (config_main, lambda d: ["trainer.nope=1"], ("trainer.nope", "unknown key")),
    # data files and rows
    "missing train file": (train_main, lambda d: train_args(d, "data.train_files=[/nonexistent/t.parquet]"),
                           ("/nonexistent/t.parquet",)),
    "unsupported file type": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'table.csv'}]"),
                              ("table.csv", "unsupported data file type")),
    "invalid JSON line": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'not_json.jsonl'}]"),
                          ("not_json.jsonl", "line 2", "invalid JSON")),
    "row that is not an object": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'list_row.jsonl'}]"),
                                  ("list_row.jsonl", "expected a JSON object")),
    "non-UTF-8 bytes": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'latin1.jsonl'}]"),
                        ("latin1.jsonl", "line 1", "not UTF-8", "0xe9")),
    "file without rows": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'no_rows.jsonl'}]"),
                          ("no rows", "no_rows.jsonl")),
    "corrupt parquet": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'corrupt.parquet'}]"),
                        ("corrupt.parquet", "not a readable parquet file")),
    "row without a prompt": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'no_prompt.jsonl'}]"),
                             ("no_prompt.jsonl", "row 0", "'prompt'", "missing column")),
    "prompt of the wrong type": (train_main, lambda d: train_args(d, f"data.train_files=[{d / 'int_prompt.jsonl'}]"),
                                 ("int_prompt.jsonl", "'prompt'", "got int")),
    "prompt longer than allowed": (train_main, lambda d: train_args(d, "data.max_prompt_length=4"),
                                   ("max_prompt_length=4", "truncation")),
    "batch larger than the data": (train_main, lambda d: train_args(d, "data.train_batch_size=64"),
                                   ("batch_size=64", "8 rows")),
    # models
    "missing model": (train_main, lambda d: train_args(d, "actor_rollout_ref.model.path=/nonexistent_model"),
                      ("/nonexistent_model", "not an existing folder")),
    "empty model folder": (train_main, lambda d: train_args(d, f"actor_rollout_ref.model.path={d / 'empty_model'}"),
                           ("empty_model", "config.json")),
    "model folder without a config": (
        train_main, lambda d: train_args(d, f"actor_rollout_ref.model.path={d / 'no_config_model'}"),
        ("no_config_model", "config.json"),
    ),
    "model with NaN weights": (train_main, lambda d: train_args(d, f"actor_rollout_ref.model.path={d / 'nan_model'}"),
                               ("non-finite logits", "the model is broken")),
    # rewards
    "missing reward file": (train_main, lambda d: train_args(d, "custom_reward_function.path=/nonexistent/r.py"),
                            ("custom_reward_function.path", "/nonexistent/r.py")),
    "reward file with a syntax error": (
        train_main, lambda d: train_args(d, f"custom_reward_function.path={d / 'reward_syntax.py'}"),
        ("reward_syntax.py", "SyntaxError"),
    ),
    "reward function name not in the file": (
        train_main, lambda d: train_args(d, f"custom_reward_function.path={d / 'reward_other_name.py'}"),
        ("reward_other_name.py", "no function 'compute_score'", "other"),
    ),
    "reward file that exits at import": (
        train_main, lambda d: train_args(d, f"custom_reward_function.path={d / 'reward_exits.py'}"),
        ("reward_exits.py", "exit code 7"),
    ),
    # tools (agent loop)
    "tool config naming a missing class": (
        train_main, lambda d: train_args(d, "actor_rollout_ref.rollout.multi_turn.enable=true",
                                         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={d / 'tools_missing_class.yaml'}"),
        ("tools_missing_class.yaml", "NoSuchTool", "hybridflow.tools.calculator"),
    ),
    # checkpoints
    "resume from a folder that is no checkpoint": (
        train_main, lambda d: train_args(d, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={d / 'run'}"),
        ("resume_from_path", "run"),
    ),
    # eval
    "eval: missing file": (eval_main, lambda d: ["data.path=/nonexistent/g.parquet"], ("/nonexistent/g.parquet", "not found")),
    "eval: no responses column": (eval_main, lambda d: [f"data.path={d / 'no_responses.jsonl'}"],
                                  ("no_responses.jsonl", "'responses'", "missing column")),
    "eval: unknown key": (eval_main, lambda d: ["data.pth=x"], ("data.pth", "unknown key")),
    # generate
    "generate: missing file": (generate_main, lambda d: ["data.path=/nonexistent/g.parquet", "model.path=tiny-llama"],
                               ("/nonexistent/g.parquet", "not found")),
    "generate: zero samples": (generate_main, lambda d: [f"data.path={d / 'test.parquet'}", "data.n_samples=0"],
                               ("data.n_samples", "≥ 1")),
    "generate: missing model": (generate_main, lambda d: [f"data.path={d / 'test.parquet'}", "model.path=/nonexistent_model"],
                                ("/nonexistent_model",)),
    # export
    "export: not a checkpoint": (export_main, lambda d: ["merge", "--local_dir", str(d / "empty_model"),
                                                         "--target_dir", str(d / "export_out")], ("empty_model",)),
    # sft
    "sft: missing file": (sft_main, lambda d: sft_args(d, "data.train_files=[/nonexistent/s.parquet]"),
                          ("/nonexistent/s.parquet",)),
    "sft: row without a response": (sft_main, lambda d: sft_args(d, f"data.train_files=[{d / 'sft_no_response.jsonl'}]"),
                                    ("sft_no_response.jsonl", "'response'", "missing column")),
    "sft: unknown key": (sft_main, lambda d: sft_args(d, "optim.lrr=1"), ("optim.lrr", "unknown key")),
    # data and plot commands
    "data: zero digits": (data_main, lambda d: ["arithmetic", "--out", str(d / "task"), "--digits", "0"],
                          ("digits must be at least 1",)),
    "data: bad size": (data_main, lambda d: ["arithmetic", "--out", str(d / "task"), "--train-size", "-3"], ("train",)),
    "plot: missing run": (plot_main, lambda d: ["/nonexistent/run"], ("/nonexistent/run",)),
    # server
    "serve: port out of range": (serve_main, lambda d: ["--model", "tiny-llama", "--port", "70000"],
                                 ("70000 is not a TCP port",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_gives_a_clean_message_and_exit_2(name: str, files: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HYBRIDFLOW_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("HOME", str(files / "home"))  # nothing may land in the real home folder
    entry, argv, expected = CASES[name]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = entry(argv(files))
        except SystemExit as exc:  # argparse errors exit 2 with their usage line
            code = exc.code
    message = err.getvalue()
    assert code == 2, f"{name}: exit code {code}; stderr:\n{message}\nstdout:\n{out.getvalue()}"
    assert "Traceback" not in message
    for part in expected:
        assert part in message, f"{name}: {part!r} not in the message:\n{message}"


def test_the_corpus_is_large():
    assert len(CASES) >= 35


def test_debug_shows_the_traceback(files: Path, monkeypatch: pytest.MonkeyPatch):
    from hybridflow.data.io import DataFileError

    monkeypatch.setenv("HYBRIDFLOW_DEBUG", "1")
    with pytest.raises(DataFileError, match="table.csv"):
        train_main(train_args(files, f"data.train_files=[{files / 'table.csv'}]"))
