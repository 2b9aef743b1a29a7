"""load_model_and_tokenizer / load_value_model: sources, options, and clear errors."""

from __future__ import annotations

import shutil

import pytest
import torch

from hybridflow.models import (
    ModelLoadError,
    ValueHeadModel,
    load_model_and_tokenizer,
    load_tokenizer,
    load_value_model,
    parse_dtype,
    resolve_model_path,
)
from hybridflow.models.tiny import build_tiny_model

IDS = torch.tensor([[10, 20, 30, 40]])


def test_folder_loads_with_identical_logits(tiny_model_dir) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    assert not model.training
    torch.testing.assert_close(model(IDS).logits, build_tiny_model(seed=0)(IDS).logits, rtol=0, atol=0)
    assert tokenizer.decode(tokenizer.encode("a  b\n")) == "a  b\n"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_tiny_names_are_built_once_into_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))
    folder = resolve_model_path("tiny-qwen2")
    assert folder.parent == tmp_path / "models" and (folder / "config.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    model, _ = load_model_and_tokenizer("tiny-qwen2")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_bf16(tiny_model_dir) -> None:
    model, _ = load_model_and_tokenizer(tiny_model_dir, dtype="bf16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert parse_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unsupported model dtype 'fp16'; valid: fp32, float32, bf16, bfloat16"):
        parse_dtype("fp16")


def test_lora_trains_only_adapters_and_starts_equal_to_base(tiny_model_dir) -> None:
    model, _ = load_model_and_tokenizer(tiny_model_dir, lora_rank=4, lora_alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)  # all-linear leaves the tied head alone
    base = build_tiny_model(seed=0)
    torch.testing.assert_close(model(IDS).logits, base(IDS).logits, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="lora_rank must be >= 0"):
        load_model_and_tokenizer(tiny_model_dir, lora_rank=-1)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir) -> None:
    grads = []
    for checkpointing in (False, True):
        model, _ = load_model_and_tokenizer(tiny_model_dir, gradient_checkpointing=checkpointing)
        model.train()
        model(IDS, labels=IDS).loss.backward()
        grads.append(model.model.layers[0].mlp.up_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-7)


def test_value_model(tiny_model_dir) -> None:
    critic, _ = load_value_model(tiny_model_dir, seed=3)
    assert isinstance(critic, ValueHeadModel)
    values = critic(IDS)
    assert values.shape == (1, 4) and values.dtype == torch.float32
    again, _ = load_value_model(tiny_model_dir, seed=3)
    torch.testing.assert_close(again(IDS), values, rtol=0, atol=0)
    base_hidden = build_tiny_model(seed=0).model(IDS).last_hidden_state
    torch.testing.assert_close(critic.backbone(IDS).last_hidden_state, base_hidden, rtol=0, atol=0)
    lora_critic, _ = load_value_model(tiny_model_dir, lora_rank=2)
    trainable = {n.split(".")[0] for n, p in lora_critic.named_parameters() if p.requires_grad}
    assert trainable == {"backbone", "v_head"}


def test_missing_path_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"not an existing folder and not a known model name \(known names: "
                       r"gemma3-270m, smollm2-135m-instruct, tiny-gemma3, tiny-llama, tiny-qwen2, tiny-qwen2-vl, tiny-qwen3\)"):
        load_model_and_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model_and_tokenizer(tmp_path / "empty")
    with pytest.raises(ValueError, match="model path is empty"):
        resolve_model_path("")


def test_corrupt_or_missing_weights_are_clear_errors(tiny_model_dir, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="could not load model weights from .*broken"):
        load_model_and_tokenizer(broken)
    with pytest.raises(ModelLoadError, match="could not load model weights"):
        load_value_model(broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="could not load model weights"):
        load_model_and_tokenizer(broken)
    assert load_tokenizer(broken).eos_token == "<|im_end|>"  # the tokenizer alone still loads
