"""Reloading served weights from an HF folder: full copy, or an error before anything changes."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model
from hybridflow.server.weights import load_weights_from_folder


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_weights_of_another_checkpoint_are_copied_in(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    folder = save_tiny_model(tmp_path / "seed1", tokenizer, seed=1)
    target = build_tiny_model(tokenizer, seed=1)
    copied = load_weights_from_folder(model, folder)
    for name, value in target.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    # tied embeddings: the folder stores them once, and the LM head follows
    assert copied == len(target.state_dict()) - 1
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_folder_of_another_shape_is_refused_and_nothing_changes(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    before = _snapshot(model)
    folder = save_tiny_model(tmp_path / "small", tokenizer, hidden_size=64)
    with pytest.raises(ValueError, match="shape mismatches"):
        load_weights_from_folder(model, folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_unknown_and_missing_tensors_are_named(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    (tmp_path / "partial").mkdir()
    save_file({"model.norm.weight": torch.ones(128), "extra.weight": torch.ones(2)},
              str(tmp_path / "partial" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"does not have: \['extra.weight'\].*missing from the folder"):
        load_weights_from_folder(model, tmp_path / "partial")


def test_missing_or_empty_folders_are_clear_errors(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    with pytest.raises(ValueError, match="is not a folder"):
        load_weights_from_folder(model, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        load_weights_from_folder(model, tmp_path / "empty")
