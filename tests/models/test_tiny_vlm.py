"""The tiny Qwen2-VL model: vision tokens, chat template, offline folder by name, a forward with pixels."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
from transformers.utils import is_torchvision_available

from hybridflow.data.multimodal import processor_max_pixels
from hybridflow.models.processor import ImagesOnlyQwen2VLProcessor, load_processor
from hybridflow.models.sources import resolve_model_path
from hybridflow.models.tiny import save_tiny_model
from hybridflow.models.tiny_vlm import (
    IMAGE_PAD,
    TINY_VLM_MAX_PIXELS,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
    build_tiny_vlm,
    build_tiny_vlm_tokenizer,
)

IMAGE_PROMPT = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 7 + 5?"}]},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The ``tiny-qwen2-vl`` name resolved into a fresh cache (built once for this module)."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HYBRIDFLOW_CACHE", str(cache))
        path = resolve_model_path("tiny-qwen2-vl")
        assert resolve_model_path("tiny-qwen2-vl") == path  # written once, then reused
    assert path.parent == cache / "models"
    return path


def _auto_processor(folder):
    # AutoProcessor needs torchvision for Qwen2-VL's video processor; without it, the images-only class
    if is_torchvision_available():
        return AutoProcessor.from_pretrained(folder, local_files_only=True)
    return ImagesOnlyQwen2VLProcessor.from_pretrained(folder, local_files_only=True)


def test_vision_tokens_are_single_special_ids() -> None:
    tok = build_tiny_vlm_tokenizer()
    assert [tok.convert_tokens_to_ids(t) for t in VISION_TOKENS] == [512, 513, 514, 515]
    assert len(tok) == 516
    ids = tok.encode(VISION_START + IMAGE_PAD + IMAGE_PAD + VISION_END + "hi", add_special_tokens=False)
    assert ids[:4] == [512, 514, 514, 513]
    assert tok.decode(ids) == VISION_START + IMAGE_PAD + IMAGE_PAD + VISION_END + "hi"


def test_chat_template_renders_image_parts_and_strings() -> None:
    tok = build_tiny_vlm_tokenizer()
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *IMAGE_PROMPT], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is 7 + 5?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_folder_loads_offline_with_the_seeded_weights(folder) -> None:
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
    assert isinstance(model, Qwen2VLForConditionalGeneration)
    expected = build_tiny_vlm(seed=0).state_dict()
    loaded = model.state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)
    other = build_tiny_vlm(seed=1).state_dict()
    assert not torch.equal(other["lm_head.weight"], expected["lm_head.weight"])
    weights = sum(t.numel() for t in expected.values() if t.is_floating_point())
    assert weights < 500_000  # a few MB at most
    processor = _auto_processor(folder)
    text = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n"
    assert processor.tokenizer.encode(text, add_special_tokens=False) == build_tiny_vlm_tokenizer().encode(
        text, add_special_tokens=False
    )
    loaded = load_processor(folder)  # the project's loader gives the same processor
    assert isinstance(loaded, Qwen2VLProcessor)
    assert (loaded.image_token_id, processor_max_pixels(loaded), loaded.image_processor.merge_size) == (
        514,
        TINY_VLM_MAX_PIXELS,
        2,
    )
    assert json.loads((folder / "processor_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"


def test_text_model_folder_has_no_processor(tmp_path) -> None:
    assert load_processor(save_tiny_model(tmp_path / "text")) is None


def test_forward_with_pixel_values_uses_the_image(folder) -> None:
    processor = _auto_processor(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
    text = processor.apply_chat_template(IMAGE_PROMPT, add_generation_prompt=True, tokenize=False)
    logits = []
    for color in ((200, 30, 30), (10, 220, 90)):
        inputs = processor(text=[text], images=[Image.new("RGB", (84, 56), color)], return_tensors="pt")
        # 84x56 pixels: a 4 x 6 grid of 14-pixel patches, merged 2 x 2 into 6 image tokens
        assert inputs["image_grid_thw"].tolist() == [[1, 4, 6]]
        assert (inputs["input_ids"] == processor.image_token_id).sum().item() == 6
        assert inputs["pixel_values"].shape == (24, 3 * 2 * 14 * 14)
        with torch.no_grad():
            out = model(**inputs)
        assert out.logits.shape == (1, inputs["input_ids"].shape[1], 516)
        assert torch.isfinite(out.logits).all()
        logits.append(out.logits)
    # a different image changes the next-token prediction after it
    assert not torch.allclose(logits[0][0, -1], logits[1][0, -1])
