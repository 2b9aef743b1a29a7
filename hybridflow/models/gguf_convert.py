"""Turn a GGUF checkpoint into a cached Hugging Face folder (fp32 safetensors + tokenizer).

transformers can read a GGUF file (``from_pretrained(folder, gguf_file=name)``), dequantising
every tensor to fp32, but that takes ~20 s for SmolLM2-135M and the loaded model refuses
``save_pretrained`` ("quantized with gguf and is not serializable"). The model is not really
quantised any more once loaded, so dropping the quantiser and its config entry makes it
saveable; the saved folder then reloads in about a second. We convert once and cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

# Files whose presence marks a finished conversion (the folder only appears by rename).
HF_FOLDER_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer_config.json")


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Convert ``gguf_path`` into an HF model folder at ``out_dir`` and return its path.

    The conversion is written to a temporary sibling folder and renamed into place, so a
    crash never leaves a half folder at ``out_dir``. If another process finished the same
    conversion first, its folder is kept and ours discarded. Tied embeddings are kept tied
    (a GGUF without ``output.weight`` loads with ``tie_word_embeddings=True``).
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    if is_complete_hf_folder(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _convert_into(gguf_path, tmp)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not is_complete_hf_folder(out_dir):  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def is_complete_hf_folder(path: Path) -> bool:
    """True when ``path`` holds every file a finished conversion writes."""
    return path.is_dir() and all((path / name).is_file() for name in HF_FOLDER_FILES)


def _convert_into(gguf_path: Path, target: Path) -> None:
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    _drop_gguf_quantizer(model)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


def _drop_gguf_quantizer(model: PreTrainedModel) -> None:
    """Forget the GGUF 'quantisation': the weights are already dequantised fp32 tensors."""
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module.__setattr__ as tensors/modules only
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
