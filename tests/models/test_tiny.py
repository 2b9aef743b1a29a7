"""Tiny in-code models: exact tokenizer round trip, ChatML template, seeded weights, HF folder."""

from __future__ import annotations

import json
import random
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.tiny import (
    IM_END,
    IM_START,
    PAD_TOKEN,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)


def _random_ascii(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = list(string.printable) + [" "] * 20 + ["\n"] * 5
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(n)]


SAMPLES = ["", " ", "  two leading", "trailing   ", "a\n\n\tb\r\n", "What is 7+5?", "héllo ✓"] + _random_ascii(200)


def test_round_trip_is_exact_for_ascii_and_whitespace() -> None:
    tok = build_tiny_tokenizer()
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, repr(text)


def test_special_tokens_and_ids() -> None:
    tok = build_tiny_tokenizer()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 2, 3)
    assert tok.eos_token == IM_END and tok.pad_token == PAD_TOKEN
    assert tok.convert_tokens_to_ids(IM_START) == 1
    assert len(tok) == 512
    # special tokens are single ids, not split into bytes
    assert tok.encode(IM_START + "user", add_special_tokens=False)[0] == 1
    # nothing is added automatically
    assert tok("ab").input_ids == tok.encode("ab", add_special_tokens=False)


def test_chatml_template() -> None:
    tok = build_tiny_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7+5?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n7+5?<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_is_deterministic() -> None:
    assert build_tiny_tokenizer().get_vocab() == build_tiny_tokenizer().get_vocab()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3", "mistral"])
def test_model_is_seeded_and_leaves_global_rng_alone(arch: str) -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_tiny_model(arch=arch, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_tiny_model(arch=arch, seed=1)
    c = build_tiny_model(arch=arch, seed=2)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied like SmolLM2
    assert a.config.vocab_size == 512 and a.config.num_hidden_layers == 2


def test_model_dtype_and_bad_arch() -> None:
    assert build_tiny_model(dtype=torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown tiny model arch 'gpt9'"):
        build_tiny_model(arch="gpt9")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_saved_folder_reloads_with_auto_classes(tmp_path, arch: str) -> None:
    path = save_tiny_model(tmp_path / "m", arch=arch, seed=3)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp folder renamed away
    tok = AutoTokenizer.from_pretrained(path)
    ref = build_tiny_tokenizer()
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, repr(text)
    model = AutoModelForCausalLM.from_pretrained(path)
    original = build_tiny_model(arch=arch, seed=3)
    ids = torch.tensor([ref.encode("What is 7+5?")])
    assert torch.equal(model(ids).logits, original(ids).logits)
    assert json.loads((path / "config.json").read_text())["model_type"] == {"gemma3": "gemma3_text"}.get(arch, arch)


def test_qwen3_and_gemma3_shapes() -> None:
    qwen3 = build_tiny_model(arch="qwen3")
    assert qwen3.config.head_dim == 32 and not qwen3.config.use_sliding_window
    # random norm weights (HF starts them at the identity), q/k norms included
    assert not torch.equal(qwen3.model.layers[0].self_attn.q_norm.weight, torch.ones(32))
    gemma = build_tiny_model(arch="gemma3")
    config = gemma.config
    assert config.layer_types == ["sliding_attention", "full_attention"] and config.sliding_window == 8
    assert config.query_pre_attn_scalar == 64 and config.head_dim == 32
    rope = config.rope_parameters
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]
    assert gemma.model.layers[0].pre_feedforward_layernorm.weight.abs().max() > 0
    assert gemma.lm_head.weight is gemma.model.embed_tokens.weight


def test_save_refuses_to_overwrite(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_tiny_model(tmp_path / "m")


def test_fixture_folder(tiny_model_dir) -> None:
    assert (tiny_model_dir / "model.safetensors").is_file()
