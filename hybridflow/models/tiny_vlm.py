"""A tiny random vision-language model of the Qwen2-VL architecture, built entirely in code.

Multimodal code paths (image rows in the dataset, pixel values through the model, 3-D rotary
positions) need a real ``Qwen2VLForConditionalGeneration`` folder that ``AutoProcessor`` and
``AutoModelForImageTextToText`` load offline, yet runs in milliseconds. The folder holds the
model (a 2-layer language model and a 2-block vision tower, well under a megabyte of weights),
the byte-level tokenizer of :mod:`hybridflow.models.tiny` plus Qwen2-VL's vision tokens, a
chat template that renders image / video content parts the way Qwen2-VL's does, and the
processor's settings (declared as a ``Qwen2VLProcessor``) with an image processor that keeps
images small (``max_pixels``). Load the processor with
:func:`hybridflow.models.processor.load_processor`: the standard ``AutoProcessor`` load needs
torchvision for Qwen2-VL's video processor. Deterministic:
the tokenizer is trained on a fixed corpus and the weights come from a seeded generator.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from hybridflow.models.processor import ImagesOnlyQwen2VLProcessor, declare_processor_class
from hybridflow.models.tiny import build_tiny_tokenizer

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Appended after the tiny tokenizer's 512 ids, in this order: 512..515.
VISION_TOKENS: tuple[str, ...] = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# Qwen2-VL's real patch and merge sizes, so verl's image_patch_size default (14) describes it too.
TINY_VLM_PATCH_SIZE = 14
TINY_VLM_MERGE_SIZE = 2
TINY_VLM_MIN_PIXELS = 56 * 56  # 4 patches: one image token
TINY_VLM_MAX_PIXELS = 112 * 112  # 64 patches: at most 16 image tokens per image
# Bump when the tiny VLM definition changes, so stale cached folders are not reused.
TINY_VLM_CACHE_VERSION = "v1"

# ChatML with Qwen2-VL's content parts: a string content is written as it is; a list of parts
# writes each text part's text and each image / video part as its vision block (the processor
# later expands the one pad token into as many as the image has tokens).
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_vlm_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny byte-level tokenizer (:func:`~hybridflow.models.tiny.build_tiny_tokenizer`) with
    Qwen2-VL's vision tokens added as special tokens (single ids, never split) and the
    multimodal chat template :data:`VLM_CHAT_TEMPLATE`."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    return tokenizer


def build_tiny_vlm_processor(tokenizer: PreTrainedTokenizerFast | None = None) -> ImagesOnlyQwen2VLProcessor:
    """Qwen2-VL's processor: the PIL image processor (no torchvision needed) limited to
    :data:`TINY_VLM_MAX_PIXELS`, and the tokenizer; no video processor (it needs torchvision,
    see :mod:`hybridflow.models.processor`)."""
    tokenizer = tokenizer if tokenizer is not None else build_tiny_vlm_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=TINY_VLM_MIN_PIXELS,
        max_pixels=TINY_VLM_MAX_PIXELS,
        patch_size=TINY_VLM_PATCH_SIZE,
        merge_size=TINY_VLM_MERGE_SIZE,
        temporal_patch_size=2,
    )
    return ImagesOnlyQwen2VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=VLM_CHAT_TEMPLATE
    )


def build_tiny_vlm(
    tokenizer: PreTrainedTokenizerFast | None = None,
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2VLForConditionalGeneration:
    """A randomly initialised ``Qwen2VLForConditionalGeneration``.

    Language model: ``num_layers`` layers, 4 heads with 2 key/value heads, head size
    ``hidden_size / 4``, multimodal rotary sections splitting the head's frequencies between
    time, height and width. Vision tower: 2 blocks of width 32, Qwen2-VL's patch (14), temporal
    patch (2) and merge (2) sizes, projecting into ``hidden_size``. Weights are drawn from a
    generator seeded with ``seed`` without disturbing the global RNG state.
    """
    tokenizer = tokenizer if tokenizer is not None else build_tiny_vlm_tokenizer()
    config = _tiny_vlm_config(tokenizer, num_layers, hidden_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    # transformers declares PreTrainedModel.to as functools.wraps(Module.to), which type checkers read unbound
    return model.to(dtype).eval()  # type: ignore[arg-type]


def _tiny_vlm_config(tokenizer: PreTrainedTokenizerFast, num_layers: int, hidden_size: int) -> Qwen2VLConfig:
    if hidden_size % 16 != 0:
        raise ValueError(f"hidden_size must be a multiple of 16 (4 heads, rotary sections), got {hidden_size}")
    # the rotary frequencies of a head (head size / 2) split between time, height and width, as 2:3:3
    half_head = hidden_size // 4 // 2
    sections = [half_head - 2 * (half_head * 3 // 8), half_head * 3 // 8, half_head * 3 // 8]
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision_config = {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": hidden_size,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": TINY_VLM_PATCH_SIZE,
        "spatial_merge_size": TINY_VLM_MERGE_SIZE,
        "temporal_patch_size": 2,
    }
    return Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        tie_word_embeddings=True,
        image_token_id=_token_id(tokenizer, IMAGE_PAD),
        video_token_id=_token_id(tokenizer, VIDEO_PAD),
        vision_start_token_id=_token_id(tokenizer, VISION_START),
        vision_end_token_id=_token_id(tokenizer, VISION_END),
    )


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise ValueError(f"the tokenizer has no single id for {token!r}")
    return token_id


def save_tiny_vlm(path: str | os.PathLike, seed: int = 0) -> Path:
    """Write the tiny VLM folder (config, safetensors, tokenizer, processor, chat template) to
    ``path``; refuses an existing path. Written next to ``path`` and renamed into place, so an
    interrupted call never leaves a half-written model. Returns the folder path."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"refusing to overwrite existing path {path}")
    tokenizer = build_tiny_vlm_tokenizer()
    model = build_tiny_vlm(tokenizer, seed=seed)
    processor = build_tiny_vlm_processor(tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        declare_processor_class(tmp, "Qwen2VLProcessor")  # a standard Qwen2-VL folder
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def tiny_vlm_folder(models_dir: Path) -> Path:
    """The seeded tiny Qwen2-VL folder under ``models_dir``, written once (the ``tiny-qwen2-vl``
    model name)."""
    target = models_dir / f"tiny-qwen2-vl-{TINY_VLM_CACHE_VERSION}"
    if (target / "config.json").is_file():
        return target
    try:
        return save_tiny_vlm(target, seed=0)
    except OSError:
        if (target / "config.json").is_file():  # another process finished it first
            return target
        raise
