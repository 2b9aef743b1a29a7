"""Hostile files and folders: what hybridflow reads or cleans up must not turn against the user.

A corpus of attacks on the files the commands touch (issue 28, items 7, 8, 9, 10b, 10c). Each
test's docstring states the attack and the expected refusal or behaviour; a new feature that
reads, writes or deletes files adds its cases here.

* deleting: ``hybridflow export`` and ``hybridflow generate`` delete only files they wrote,
  inside their folder, never through a symbolic link;
* checkpoints: a file altered after the commit (same size) is found by its checksum; resume
  falls back to the newest checkpoint that verifies, export refuses the damaged one;
* secrets: API keys and passwords in a config are redacted wherever the config is printed or
  sent to a tracker, and a redacted print-out read back is refused rather than used as a key;
* model folders: a pickled ``pytorch_model.bin`` carrying code is refused, never run; a model
  whose weights are NaN stops SFT and reward-model training with one line, not a traceback.

New APIs are imported inside the tests, so each test fails on its own on code without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from hybridflow.data import write_rows
from hybridflow.engine import TorchEngine
from hybridflow.trainer import checkpoint as ckpt

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"
SECRET = "sk-hostile-probe-0123456789"


class Payload:
    """Unpickling this runs ``touch marker``: what a planted pickle would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _overwrite_in_place(file: Path, length: int = 200_000) -> None:
    """Bytes of ``file`` past its safetensors header become 0xFF; the size stays (a disk error,
    a bad copy). 0xFF bytes read as float32 are NaN."""
    data = bytearray(file.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # u64 header length, then the JSON header
    end = min(start + length, len(data))
    assert end - start > 1000, "the file is too small to damage past its header"
    data[start:end] = b"\xff" * (end - start)
    file.write_bytes(bytes(data))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``hybridflow ARGS`` through this interpreter, offline; ``HOME`` in ``cwd`` so nothing is
    written to the user's ~/data or cache."""
    env = {**os.environ, "HOME": str(cwd), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("HYBRIDFLOW_DEBUG", None)
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=240, check=False)


def _assert_one_line_refusal(result: subprocess.CompletedProcess, prog: str, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    # a progress bar redraws with carriage returns: the message starts after the last one
    lines = [line for line in re.split(r"[\r\n]", result.stderr) if line.startswith(f"hybridflow {prog}: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def run_template(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with one committed checkpoint (global_step_2: actor engine state, manifest)."""
    run = tmp_path_factory.mktemp("hostile_runs") / "run"
    module = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    paths = ckpt.begin_checkpoint(run, 2)
    TorchEngine(module, lr=1e-3).save_checkpoint(paths.actor)
    ckpt.save_controller_state(paths.controller_state, {"global_steps": 2})
    ckpt.commit_checkpoint(paths, 2, keep=None)
    return run


@pytest.fixture
def run_dir(run_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_template, tmp_path / "run", symlinks=True))


@pytest.fixture(scope="module")
def nan_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with every weight NaN (config and tokenizer intact)."""
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("nan_model") / "model"))
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def pickled_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model's folder with its weights replaced by a ``pytorch_model.bin`` that runs
    ``touch marker`` when unpickled; returns (folder, marker)."""
    root = tmp_path_factory.mktemp("pickled_model")
    folder = Path(shutil.copytree(tiny_model_dir, root / "model"))
    (folder / "model.safetensors").unlink()
    marker = root / "payload-ran"
    torch.save({"model.embed_tokens.weight": Payload(marker)}, folder / "pytorch_model.bin")
    return folder, marker


def test_the_planted_payload_is_live(tmp_path):
    """Guard for the pickle tests: an unrestricted load of such a file does run its command, so
    'the marker was not created' means the loader refused it, not that the payload is inert."""
    marker = tmp_path / "ran"
    torch.save(Payload(marker), tmp_path / "x.bin")
    torch.load(tmp_path / "x.bin", weights_only=False)
    assert marker.exists()


# ------------------------------------------------------------------------- 7: deleting only its own
def test_export_deletes_nothing_through_a_symlinked_folder_of_the_target(run_dir, tiny_model_dir, tmp_path):
    """Attack: the export target holds a planted ``.hybridflow_export.json`` listing
    ``sub/victim.txt`` (even with the victim's true sha256), and ``sub`` is a symbolic link to
    another folder. Expected: the export completes and the file outside the target survives —
    nothing is deleted through a link."""
    from hybridflow.export.writer import EXPORT_MANIFEST, merge_checkpoint

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("the user's file, outside the target")
    target = tmp_path / "export"
    target.mkdir()
    (target / "sub").symlink_to(outside, target_is_directory=True)
    planted = {"files": ["sub/victim.txt"], "sha256": {"sub/victim.txt": _sha256(victim)}}
    (target / EXPORT_MANIFEST).write_text(json.dumps(planted))

    merge_checkpoint(run_dir, target, hf_model_config_path=tiny_model_dir)
    assert victim.read_text() == "the user's file, outside the target"
    assert (target / "model.safetensors").is_file()


def test_export_keeps_a_listed_file_whose_content_it_did_not_record(run_dir, tiny_model_dir, tmp_path):
    """Attack: a planted export list names the user's own ``notes.txt`` in the target (a list
    without checksums, or with a checksum of other content). Expected: the export removes only
    files whose content is what it recorded writing, so the notes stay."""
    from hybridflow.export.writer import EXPORT_MANIFEST, merge_checkpoint

    target = tmp_path / "export"
    target.mkdir()
    (target / "notes.txt").write_text("the user's notes")
    (target / "draft.md").write_text("the user's draft")
    planted = {"files": ["notes.txt", "draft.md"], "sha256": {"draft.md": "0" * 64}}
    (target / EXPORT_MANIFEST).write_text(json.dumps(planted))

    merge_checkpoint(run_dir, target, hf_model_config_path=tiny_model_dir)
    assert (target / "notes.txt").read_text() == "the user's notes"
    assert (target / "draft.md").read_text() == "the user's draft"


def test_generate_restart_deletes_only_its_own_part_files(tmp_path):
    """Attack (an accident, really): the user keeps a file in ``OUT.parts``; ``hybridflow generate
    resume=false`` starts over, then finishes. Expected: the run's manifest and parts are
    replaced and removed, the user's file and the folder holding it stay."""
    from hybridflow.data.generation_journal import GenerationJournal

    output = tmp_path / "gen.jsonl"
    first = GenerationJournal(output, "old-settings", num_rows=3, batch_size=2)
    first.open(resume=True)
    first.write_batch(0, [["a"], ["b"]])
    parts = first.folder
    (parts / "notes.txt").write_text("the user's notes")

    journal = GenerationJournal(output, "new-settings", num_rows=3, batch_size=2)
    assert journal.open(resume=False) == set()  # started over: the old part is gone
    assert (parts / "notes.txt").read_text() == "the user's notes"
    assert not (parts / "batch-000000.jsonl").exists()
    journal.write_batch(0, [["c"], ["d"]])
    journal.write_batch(1, [["e"]])
    journal.assemble([{"q": i} for i in range(3)], "responses")
    assert output.is_file()
    assert sorted(p.name for p in parts.iterdir()) == ["notes.txt"]


def test_generate_refuses_a_parts_folder_that_is_a_symlink(tmp_path):
    """Attack: ``OUT.parts`` is a symbolic link to another folder of the user's. Expected: a
    clear refusal naming it, before anything is written or deleted there."""
    from hybridflow.data import DataFileError
    from hybridflow.data.generation_journal import GenerationJournal

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "manifest.json").write_text('{"the user\'s": "file"}')
    output = tmp_path / "gen.jsonl"
    output.with_name("gen.jsonl.parts").symlink_to(elsewhere, target_is_directory=True)
    for resume in (False, True):
        with pytest.raises(DataFileError, match="gen.jsonl.parts is a symbolic link"):
            GenerationJournal(output, "fp", num_rows=3, batch_size=2).open(resume=resume)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["manifest.json"]
    assert (elsewhere / "manifest.json").read_text() == '{"the user\'s": "file"}'


# ------------------------------------------------------------------ 8: checkpoints altered in place
def _small_checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint whose actor holds a real ~400 KB safetensors file."""
    paths = ckpt.begin_checkpoint(root, step)
    paths.actor.mkdir()
    g = torch.Generator().manual_seed(step)
    save_file({"w": torch.randn(100_000, generator=g)}, str(paths.actor / "model.safetensors"))
    ckpt.save_controller_state(paths.controller_state, {"global_steps": step})
    ckpt.commit_checkpoint(paths, step, keep=None)
    return paths.root


def test_resume_skips_a_checkpoint_overwritten_in_place_and_names_the_file(tmp_path, capsys):
    """Attack: 200 KB of the newest checkpoint's ``model.safetensors`` overwritten with 0xFF, the
    size unchanged (it would load as NaN weights and fail at the next rollout). Expected:
    ``resume_mode=auto`` falls back to the previous step, saying which file of which step was
    bad; ``resume_path`` to the damaged one refuses it by name."""
    previous = _small_checkpoint(tmp_path, 1)
    newest = _small_checkpoint(tmp_path, 2)
    _overwrite_in_place(newest / "actor" / "model.safetensors")

    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == previous
    out = capsys.readouterr().out
    assert "step 2" in out and "global_step_2/actor/model.safetensors is damaged" in out
    assert f"Resuming from {previous}" in out
    with pytest.raises(ckpt.CheckpointError, match="global_step_2/actor/model.safetensors is damaged"):
        ckpt.find_resume_checkpoint(tmp_path, "resume_path", str(newest))


def test_a_checkpoint_saved_without_checksums_still_resumes_with_a_note(tmp_path, capsys):
    """Compatibility: a checkpoint whose manifest records sizes only (written by an older
    hybridflow) still resumes; a note says its content was not verified."""
    root = _small_checkpoint(tmp_path, 3)
    manifest = json.loads((root / ckpt.MANIFEST_FILE).read_text())
    manifest.pop("sha256", None)
    (root / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))

    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == root
    assert "without checksums" in capsys.readouterr().out


def test_export_refuses_a_checkpoint_overwritten_in_place(run_dir, tiny_model_dir, tmp_path, capsys):
    """Attack: the checkpoint's weights are overwritten in place (same size) before an export.
    Expected: ``hybridflow export merge`` refuses with the damaged file named (exit 2) and writes
    no folder, instead of exporting NaN weights as a model."""
    from hybridflow.entrypoints.export import main as export_main

    weights = run_dir / "global_step_2" / "actor" / "model.safetensors"
    _overwrite_in_place(weights)
    target = tmp_path / "hf"
    code = export_main(["merge", "--local_dir", str(run_dir), "--target_dir", str(target),
                        "--hf_model_config_path", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{weights} is damaged" in err
    assert not target.exists()


# ----------------------------------------------------------------------------------- 9: secrets
def _secret_overrides() -> list[str]:
    return [
        f"{CHECKPOINT_ENGINE}.backend=http",
        f"{CHECKPOINT_ENGINE}.engine_kwargs.url=http://127.0.0.1:9",
        f"{CHECKPOINT_ENGINE}.engine_kwargs.api_key={SECRET}",
        f"custom_reward_function.reward_kwargs.judge_api_key={SECRET}-judge",
        f"reward_model.sandbox_fusion.url=https://runner:{SECRET}-url@sandbox.example:8080/run_code",
    ]


def test_config_print_redacts_every_secret(capsys):
    """Attack: ``hybridflow config`` (its output pasted into an issue, a log, a chat) with
    ``checkpoint_engine.engine_kwargs.api_key``, a judge key and a URL password set. Expected:
    none of them is printed; the keys show ``<redacted>``, the URL keeps all but its password."""
    from hybridflow.cli import main as cli_main

    assert cli_main(["config", *_secret_overrides()]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    printed = yaml.safe_load(out)
    kwargs = printed["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["engine_kwargs"]
    assert kwargs == {"url": "http://127.0.0.1:9", "api_key": "<redacted>"}
    assert printed["custom_reward_function"]["reward_kwargs"] == {"judge_api_key": "<redacted>"}
    assert printed["reward_model"]["sandbox_fusion"]["url"] == "https://runner:<redacted>@sandbox.example:8080/run_code"
    assert printed["data"]["prompt_key"] == "prompt"  # a column name, not a secret


def test_trackers_never_receive_a_secret(tmp_path, monkeypatch):
    """Attack: a run with secrets in its config logs to W&B (synced to a shared project).
    Expected: the config the tracker records has every secret redacted."""
    import types

    from hybridflow.config import load_config, to_dict
    from hybridflow.tracking import Tracking

    recorded: dict = {}

    class FakeRun:
        config = types.SimpleNamespace(update=lambda *a, **k: None)

        def log(self, *args, **kwargs) -> None:
            pass

        def finish(self) -> None:
            pass

    def init(**kwargs):
        recorded.update(kwargs)
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = to_dict(load_config(None, _secret_overrides()))
    tracking = Tracking(["wandb"], tmp_path, config=config)
    tracking.finish()
    assert recorded["config"]["trainer"] == config["trainer"]  # the rest of the config is there
    assert SECRET not in json.dumps(recorded["config"])


def test_a_redacted_print_out_read_back_is_refused_not_sent_as_the_key(tmp_path, capsys, monkeypatch):
    """Attack (an accident, really): the printed, redacted config is saved and used as
    ``--config`` to resume. Expected: loading refuses it, naming the key, instead of sending
    ``<redacted>`` to the server as the API key; the real key given again (an override, or
    ``${oc.env:VAR}``) loads."""
    from hybridflow.cli import main as cli_main
    from hybridflow.config import ConfigError, load_config

    assert cli_main(["config", *_secret_overrides()]) == 0
    saved = tmp_path / "resolved.yaml"
    saved.write_text(capsys.readouterr().out)
    with pytest.raises(ConfigError, match=rf"{CHECKPOINT_ENGINE}.engine_kwargs.api_key: is '<redacted>'"):
        load_config([str(saved)])

    monkeypatch.setenv("HYBRIDFLOW_TEST_KEY", SECRET)
    cfg = load_config([str(saved)], [
        f"{CHECKPOINT_ENGINE}.engine_kwargs.api_key=${{oc.env:HYBRIDFLOW_TEST_KEY}}",
        f"custom_reward_function.reward_kwargs.judge_api_key={SECRET}-judge",
        f"reward_model.sandbox_fusion.url=https://runner:{SECRET}-url@sandbox.example:8080/run_code",
    ])
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs["api_key"] == SECRET


def test_the_secret_key_rule():
    """The one rule that marks secrets: API keys, tokens, passwords, auth headers are secret; the
    config's column names (``prompt_key``, ...) and a tokenizer's ``pad_token`` are not, and no
    declared key of any command's config is a secret today (a new one would be redacted: add it
    here on purpose)."""
    from hybridflow.config import PPOConfig, SFTConfig
    from hybridflow.config.render import leaf_paths
    from hybridflow.config.rm import RMConfig
    from hybridflow.config.secrets import is_secret_key
    from hybridflow.entrypoints.generate import GenerationConfig
    from hybridflow.trainer.offline_eval import EvalConfig

    for name in ("api_key", "apiKey", "API-KEY", "judge_api_key", "hf_token", "token", "access_token", "password",
                 "db_password", "client_secret", "Authorization", "cookie", "private_key", "aws_secret_access_key"):
        assert is_secret_key(name), name
    for name in ("prompt_key", "response_key", "reward_fn_key", "messages_key", "chosen_key", "pad_token",
                 "eos_token", "max_token_len", "ppo_max_token_len_per_gpu", "url", "timeout_s", "tokenizer"):
        assert not is_secret_key(name), name
    for root in (PPOConfig, SFTConfig, RMConfig, GenerationConfig, EvalConfig):
        assert [p for p in leaf_paths(root) if any(is_secret_key(part) for part in p.split("."))] == []


# ------------------------------------------------------------------------ 10b: pickled model files
def test_a_pickled_model_file_is_refused_not_run(pickled_model_dir):
    """Attack: ``model.path`` is a folder whose ``pytorch_model.bin`` carries code in a pickle.
    Expected: the load is refused with the checkpoint loader's message naming the file (an
    input error, not an ``UnpicklingError``), and the code never runs."""
    from hybridflow.models import load_model_and_tokenizer
    from hybridflow.utils.errors import InputError

    folder, marker = pickled_model_dir
    with pytest.raises(InputError) as info:
        load_model_and_tokenizer(folder)
    message = str(info.value)
    assert f"{folder / 'pytorch_model.bin'}: refused: it holds Python objects other than tensors" in message
    assert "weights_only` set to `False`" not in message  # torch's advice would run the payload
    assert not marker.exists()


def test_generate_with_a_pickled_model_stops_with_one_line(pickled_model_dir, tmp_path):
    """Attack: the same folder given to a command, ``hybridflow generate model.path=...``.
    Expected: exit 2 with one line naming the file and the refusal, no traceback, no code run."""
    folder, marker = pickled_model_dir
    prompts = write_rows([{"prompt": "What is 1 + 1?"}], tmp_path / "prompts.jsonl")
    result = _cli("generate", f"model.path={folder}", f"data.path={prompts}",
                  f"data.output_path={tmp_path / 'out.jsonl'}", "rollout.response_length=4", cwd=tmp_path)
    _assert_one_line_refusal(result, "generate", f"{folder / 'pytorch_model.bin'}: refused")
    assert not marker.exists()


# --------------------------------------------------------------------------- 10c: NaN weights
def test_sft_on_a_model_with_nan_weights_stops_with_one_line(nan_model_dir, tmp_path):
    """Attack: ``hybridflow sft`` on a model whose weights are NaN. Expected: exit 2 with the RL
    sampler's one-line message (non-finite logits, check its weights), no traceback."""
    rows = [{"prompt": f"What is {i} + 1?", "response": f"{i + 1}"} for i in range(4)]
    train = write_rows(rows, tmp_path / "train.jsonl")
    result = _cli("sft", f"model.path={nan_model_dir}", f"data.train_files=[{train}]", "data.val_files=[]",
                  "data.max_length=64", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=4",
                  "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'run'}",
                  "trainer.logger=[jsonl]", "trainer.export_hf=false", cwd=tmp_path)
    _assert_one_line_refusal(result, "sft", "the model produced non-finite logits (NaN or inf)",
                             "the model is broken (check its weights)")


def test_rm_on_a_model_with_nan_weights_stops_with_one_line(nan_model_dir, tmp_path):
    """Attack: ``hybridflow rm`` on a model whose weights are NaN (its scores are NaN, every step
    would be skipped in silence). Expected: the same one-line message, exit 2, no traceback."""
    rows = [{"prompt": f"What is {i} + 1?", "chosen": f"{i + 1}", "rejected": f"{i + 2}"} for i in range(4)]
    train = write_rows(rows, tmp_path / "pairs.jsonl")
    result = _cli("rm", f"model.path={nan_model_dir}", "model.dtype=fp32", f"data.train_files=[{train}]",
                  "data.val_files=[]", "data.max_length=64", "data.train_batch_size=4",
                  "data.micro_batch_size_per_gpu=4", "trainer.total_training_steps=1",
                  f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]",
                  "trainer.export_hf=false", cwd=tmp_path)
    _assert_one_line_refusal(result, "rm", "the model produced non-finite logits (NaN or inf)",
                             "the model is broken (check its weights)")
