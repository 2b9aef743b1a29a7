"""``hybridflow generate``'s batches with images: the rows' pixel inputs and 3-D positions put
where the built-in rollout reads them, and the resume fingerprint of the images.

Kept apart from :mod:`hybridflow.entrypoints.generate` so that module stays about prompts,
files and the command; what here is built must match what the RL dataset gives the trainer's
rollout (``multi_modal_inputs`` per row, positions ``(B, 3, P)`` from :func:`rope_index`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.data import left_pad
from hybridflow.data.multimodal import MultimodalPrompt, rope_index, rope_settings
from hybridflow.protocol import DataProto


def prompt_batch(
    prompts: list[list[int]], pad: int, images: list[MultimodalPrompt] | None = None, processor: Any = None
) -> DataProto:
    """The prompts left-padded together; with ``images`` (one per prompt), the rows' pixel inputs
    (``multi_modal_inputs``) and Qwen2-VL's 3-D positions ``(B, 3, P)``, as the RL dataset gives them."""
    width = max(len(p) for p in prompts)
    ids, mask, pos = (torch.stack(t) for t in zip(*(left_pad(p, width, pad) for p in prompts), strict=True))
    non_tensors: dict[str, Any] = {}
    if images is not None:
        token_id, merge_size = rope_settings(processor)
        pos = torch.stack([
            rope_index(ids[i], mask[i], prompt.multi_modal_inputs.get("image_grid_thw"),
                       image_token_id=token_id, spatial_merge_size=merge_size)
            for i, prompt in enumerate(images)
        ])  # fmt: skip
        column = np.empty(len(images), dtype=object)
        for i, prompt in enumerate(images):
            column[i] = prompt.multi_modal_inputs
        non_tensors[F.MULTI_MODAL_INPUTS] = column
    return DataProto.from_dict(
        tensors={F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: pos}, non_tensors=non_tensors
    )


def images_digest(rows: list[dict[str, Any]], image_key: str) -> str:
    """Hash of every row's images column: two images of one size give the same token ids, so the
    resume fingerprint hashes the stored images (bytes or paths) themselves."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, (bytes, bytearray, memoryview)):
            digest.update(bytes(value))
        elif isinstance(value, dict):
            for key in sorted(value):
                digest.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple, np.ndarray)):
            digest.update(b"[%d]" % len(value))
            for item in value:
                feed(item)
        elif hasattr(value, "tobytes"):  # a PIL image
            digest.update(value.tobytes())
        else:
            digest.update(repr(value).encode())

    for row in rows:
        feed(row.get(image_key))
    return digest.hexdigest()
