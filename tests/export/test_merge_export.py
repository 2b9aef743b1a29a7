"""Model merger: an actor checkpoint after a training step → HF folder with identical outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow import fields as FK
from hybridflow.cli import main as cli_main
from hybridflow.config import load_config
from hybridflow.engine.checkpoint import MODEL_FILE
from hybridflow.export.writer import merge_checkpoint
from hybridflow.trainer.checkpoint import LATEST_FILE
from hybridflow.workers.actor import ActorWorker


def _train_and_save(model_dir: Path, run_dir: Path, make_batch, *extra: str) -> ActorWorker:
    """One PPO update of an actor on the tiny model, saved as run_dir/global_step_1/actor."""
    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        *extra,
    ])
    worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    worker.update_actor(make_batch(seed=3))
    worker.save_checkpoint(str(run_dir / "global_step_1" / "actor"))
    (run_dir / LATEST_FILE).write_text("1")
    return worker


@pytest.fixture(scope="module")
def plain_run(tiny_model_dir, make_rollout_batch, tmp_path_factory):
    run = tmp_path_factory.mktemp("plain_run")
    return _train_and_save(tiny_model_dir, run, make_rollout_batch), run


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, make_rollout_batch, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora_run")
    extra = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
             "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    return _train_and_save(tiny_model_dir, run, make_rollout_batch, *extra), run


def _logits(model: torch.nn.Module, batch) -> torch.Tensor:
    """Logits at the real (unmasked) positions; padded positions hold kernel-dependent garbage."""
    with torch.no_grad():
        logits = model(input_ids=batch[FK.INPUT_IDS], attention_mask=batch[FK.ATTENTION_MASK],
                       position_ids=batch[FK.POSITION_IDS]).logits
    return logits[batch[FK.ATTENTION_MASK].bool()]


def _greedy(model: torch.nn.Module, tokenizer) -> torch.Tensor:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=3)
    return out[0, prompt["input_ids"].shape[1]:]


def _reload(folder: Path, attn_implementation: str | None = None) -> torch.nn.Module:
    """The exported folder as HF loads it; bit-identical logits need the same attention kernel
    as the worker's (eager and SDPA differ in the last bits)."""
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **extra).eval()


def test_plain_export_from_the_run_folder_reproduces_logits_and_greedy_tokens(
    plain_run, make_rollout_batch, tiny_model_dir, tmp_path
):
    worker, run = plain_run
    out = merge_checkpoint(run, tmp_path / "hf")  # run folder → latest step → actor/
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    exported = _reload(out, worker.module.config._attn_implementation)
    batch = make_rollout_batch(seed=5).batch
    assert torch.equal(_logits(exported, batch), _logits(worker.module, batch))
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    greedy = _greedy(exported, tokenizer)
    assert torch.equal(greedy, _greedy(worker.module, worker.tokenizer)) and len(greedy) == 12
    assert tokenizer("a + b = 12")["input_ids"] == worker.tokenizer("a + b = 12")["input_ids"]
    assert exported.generation_config.eos_token_id == 2
    # the export holds the trained weights, not the starting model's
    start = load_file(str(tiny_model_dir / MODEL_FILE))
    trained = load_file(str(out / MODEL_FILE))
    assert (trained["model.layers.0.mlp.up_proj.weight"] - start["model.layers.0.mlp.up_proj.weight"]).abs().max() > 1e-4


def test_bf16_export_holds_the_cast_weights(plain_run, tmp_path):
    worker, run = plain_run
    out = merge_checkpoint(run / "global_step_1", tmp_path / "bf16", dtype="bf16")
    weights = load_file(str(out / MODEL_FILE))
    name = "model.layers.1.self_attn.q_proj.weight"
    assert weights[name].dtype == torch.bfloat16
    assert torch.equal(weights[name], worker.module.state_dict()[name].to(torch.bfloat16))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_lora_merged_export_matches_the_adapted_policy(lora_run, make_rollout_batch, tmp_path):
    worker, run = lora_run
    out = merge_checkpoint(run / "global_step_1" / "actor", tmp_path / "merged")
    assert not any(".lora_" in name for name in load_file(str(out / MODEL_FILE)))
    # gradient checkpointing switched the KV cache off in training; the export turns it back on
    saved = run / "global_step_1" / "actor" / "hf_config" / "config.json"
    assert json.loads(saved.read_text())["use_cache"] is False
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    exported = _reload(out, worker.module.config._attn_implementation)
    batch = make_rollout_batch(seed=6).batch
    torch.testing.assert_close(_logits(exported, batch), _logits(worker.module, batch), rtol=0, atol=1e-5)
    assert torch.equal(_greedy(exported, worker.tokenizer), _greedy(worker.module, worker.tokenizer))
    with worker.module.disable_adapter():  # the adapters did change the policy
        assert (_logits(worker.module, batch) - _logits(exported, batch)).abs().max() > 1e-4


def test_lora_adapter_export_loads_on_the_base_model(lora_run, make_rollout_batch, tiny_model_dir, tmp_path):
    from peft import PeftModel

    worker, run = lora_run
    out = merge_checkpoint(run, tmp_path / "adapter", lora="adapter")
    assert (out / "adapter_model.safetensors").is_file() and not (out / MODEL_FILE).exists()
    adapter_cfg = json.loads((out / "adapter_config.json").read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"]) == (4, 8)
    assert Path(adapter_cfg["base_model_name_or_path"]) == tiny_model_dir
    kernel = worker.module.base_model.model.config._attn_implementation
    model = PeftModel.from_pretrained(_reload(tiny_model_dir, kernel), out).eval()
    batch = make_rollout_batch(seed=7).batch
    torch.testing.assert_close(_logits(model, batch), _logits(worker.module, batch), rtol=0, atol=1e-6)
    renamed = merge_checkpoint(run, tmp_path / "adapter2", lora="adapter", base_model_name_or_path="org/base")
    assert json.loads((renamed / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/base"


def test_export_test_subcommand_passes_on_equal_and_fails_on_different_weights(plain_run, tiny_model_dir, tmp_path, capsys):
    _, run = plain_run
    out = tmp_path / "hf"
    assert cli_main(["export", "merge", "--local_dir", str(run), "--target_dir", str(out)]) == 0
    assert cli_main(["export", "test", "--local_dir", str(run), "--test_hf_dir", str(out)]) == 0  # checkpoint vs export
    assert "OK: " in capsys.readouterr().out
    assert cli_main(["export", "test", "--local_dir", str(out), "--test_hf_dir", str(tiny_model_dir)]) == 1
    report = capsys.readouterr().out
    assert "MISMATCH" in report and "values differ: model.layers.0.mlp.up_proj.weight" in report
