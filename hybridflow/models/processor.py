"""A model folder's multimodal processor (image processor + tokenizer), loaded offline.

``AutoProcessor.from_pretrained`` builds a Qwen2-VL processor from three parts: the image
processor, the tokenizer and a video processor. transformers' video processors need
torchvision, which the project does not depend on, so on a machine without it the standard
load of any Qwen2-VL folder (a real one too) fails on the video part. Only images are supported
here, so :class:`ImagesOnlyQwen2VLProcessor` — Qwen2-VL's processor with its image and text
halves and no video processor — takes its place there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoProcessor, Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin
from transformers.utils import is_torchvision_available

PROCESSOR_FILES: tuple[str, ...] = ("preprocessor_config.json", "processor_config.json")
# model types whose processor handles images exactly as Qwen2-VL's does
QWEN2_VL_FAMILY: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")
QWEN2_VL_PROCESSORS: tuple[str, ...] = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")


class ImagesOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor without a video processor: images and text only.

    Everything but the constructor is Qwen2-VL's: image token expansion, chat template,
    ``image_grid_thw``. The constructor sets the vision token names and ids as Qwen2-VL's
    does, then builds the processor from two parts instead of three (``from_pretrained`` reads
    the parts from this signature, so it never asks for a video processor).
    """

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any):
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)


def load_processor(model_folder: str | Path) -> Any | None:
    """The folder's multimodal processor, or None for a folder without an image processor (a
    text-only model). ``AutoProcessor`` first; without torchvision, a Qwen2-VL-family folder
    (its ``config.json`` says so, or — a checkpoint's ``tokenizer/`` — its processor files do)
    whose standard load fails gets :class:`ImagesOnlyQwen2VLProcessor`."""
    folder = Path(model_folder)
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    try:
        processor = AutoProcessor.from_pretrained(folder)
    except Exception:
        qwen2_vl = _model_type(folder) in QWEN2_VL_FAMILY or _processor_class(folder) in QWEN2_VL_PROCESSORS
        if is_torchvision_available() or not qwen2_vl:
            raise
        processor = ImagesOnlyQwen2VLProcessor.from_pretrained(folder)
    return processor if getattr(processor, "image_processor", None) is not None else None


def save_tokenizer_or_processor(tokenizer: Any, processor: Any | None, folder: str | Path) -> None:
    """Write ``processor`` (its tokenizer included) to ``folder`` when there is one, else
    ``tokenizer``: a checkpoint of a vision-language model keeps the image processor's settings,
    so the exported folder (and a GRPO run starting from it) reads images as training did."""
    if processor is None:
        tokenizer.save_pretrained(folder)
        return
    processor.save_pretrained(folder)
    if isinstance(processor, ImagesOnlyQwen2VLProcessor):
        declare_processor_class(folder, "Qwen2VLProcessor")


def declare_processor_class(folder: str | Path, class_name: str) -> None:
    """Name ``class_name`` as the folder's processor class in the files that record it, so a
    folder saved from :class:`ImagesOnlyQwen2VLProcessor` reads as a standard one."""
    for name in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json"):
        path = Path(folder) / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if "processor_class" in data:
                data["processor_class"] = class_name
                path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _processor_class(folder: Path) -> str | None:
    try:
        return json.loads((folder / "processor_config.json").read_text(encoding="utf-8")).get("processor_class")
    except (OSError, ValueError):
        return None


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None
