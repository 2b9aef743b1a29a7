"""The policy loader on a vision-language folder: ``AutoModelForImageTextToText`` picked from the
config's ``vision_config``, without help from ``AutoModelForCausalLM`` registrations."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2VLConfig

from hybridflow.models.loader import is_vision_language_folder, load_causal_lm
from hybridflow.models.tiny_vlm import build_tiny_vlm, save_tiny_vlm


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


def test_a_vision_language_folder_loads_its_conditional_generation_class(folder, monkeypatch) -> None:
    # Take away any AutoModelForCausalLM registration of Qwen2-VL: the loader must not need one.
    extra = dict(AutoModelForCausalLM._model_mapping._extra_content)
    extra.pop(Qwen2VLConfig, None)
    monkeypatch.setattr(AutoModelForCausalLM._model_mapping, "_extra_content", extra)
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    model = load_causal_lm(folder, dtype="fp32")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    reference = build_tiny_vlm(seed=0).float().state_dict()
    loaded = model.state_dict()
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_which_folders_are_vision_language(folder, tiny_model_dir, tmp_path) -> None:
    assert is_vision_language_folder(folder)
    assert not is_vision_language_folder(tiny_model_dir)
    assert not is_vision_language_folder(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    assert not is_vision_language_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vision_config": None}))
    assert not is_vision_language_folder(tmp_path)
