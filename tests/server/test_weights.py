"""Reloading served weights from an HF folder: full copy, or an error before anything changes."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridflow.inference.weights import (
    WeightsRejected,
    folder_under_root,
    load_weights_from_folder,
)
from hybridflow.models.tiny import (
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)


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


def test_missing_or_empty_folders_get_one_generic_error(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    messages = set()
    for given in ("nope", "empty", "file"):
        with pytest.raises(WeightsRejected) as info:
            load_weights_from_folder(model, tmp_path / given, given)
        messages.add(str(info.value).replace(repr(given), "PATH"))
    # one wording for every case: an error does not tell which paths exist on the server
    assert messages == {"model_path PATH is not a folder of *.safetensors weights inside the server's weights root"}


def test_non_finite_weights_are_refused_and_nothing_changes(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    before = _snapshot(model)
    folder = save_tiny_model(tmp_path / "nan", tokenizer, seed=1)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    weights["model.norm.weight"][3] = float("inf")
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(WeightsRejected, match=r"not finite .* in 2 tensors: .*up_proj.*model.norm.weight"):
        load_weights_from_folder(model, folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_values_that_overflow_the_served_dtype_are_refused(tmp_path, tokenizer):
    model = build_tiny_model(tokenizer, seed=0).to(torch.float16)
    folder = save_tiny_model(tmp_path / "big", tokenizer, seed=1)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.norm.weight"][0] = 1e6  # finite in fp32, inf in fp16
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(WeightsRejected, match="model.norm.weight"):
        load_weights_from_folder(model, folder)


def test_paths_must_resolve_inside_the_weights_root(tmp_path):
    root = tmp_path / "root"
    (root / "step_50").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    assert folder_under_root(root, "step_50") == (root / "step_50").resolve()
    assert folder_under_root(root, str(root / "step_50")) == (root / "step_50").resolve()
    assert folder_under_root(root, "not_yet_there") == (root / "not_yet_there").resolve()
    for given in ("../outside", str(tmp_path / "outside"), "link", "/etc", "step_50/../../outside"):
        with pytest.raises(WeightsRejected, match="inside the server's weights root"):
            folder_under_root(root, given)
