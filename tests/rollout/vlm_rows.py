"""verl-layout multimodal parquet rows for the vision-language tests: ``<image>`` placeholders
in the prompt and an ``images`` column of ``{"bytes", "path"}`` dicts (how Hugging Face
``datasets`` writes an Image feature), small seeded PNG images."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from hybridflow.data.io import write_rows

# (prompt with placeholders, image sizes (width, height)); one row without images
PROMPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("<image>What colour is this?", ((56, 56),)),
    ("Compare <image> and <image>: which is brighter?", ((84, 56), (56, 84))),
    ("Count the squares: <image>", ((112, 56),)),
    ("What is 2 + 3?", ()),
)


def png(width: int, height: int, seed: int) -> bytes:
    """A seeded random-noise RGB image, PNG-encoded."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def vlm_rows(count: int, seed: int = 0) -> list[dict]:
    """``count`` rows cycling through :data:`PROMPTS`, each with its own images."""
    rows = []
    for i in range(count):
        text, sizes = PROMPTS[i % len(PROMPTS)]
        rows.append(
            {
                "data_source": "vlm_test",
                "prompt": [{"role": "user", "content": text}],
                "reward_model": {"style": "rule", "ground_truth": str(i % 3)},
                "extra_info": {"index": i},
                "images": [
                    {"bytes": png(w, h, seed * 1000 + 10 * i + k), "path": None} for k, (w, h) in enumerate(sizes)
                ],
            }
        )
    return rows


def write_vlm_parquet(path: Path, count: int, seed: int = 0) -> Path:
    """Write :func:`vlm_rows` to ``path`` (parquet); returns it."""
    return write_rows(vlm_rows(count, seed), path)
