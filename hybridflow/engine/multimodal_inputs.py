"""Image inputs of a vision-language model (Qwen2-VL) through the engine's micro-batches.

A multimodal row carries, besides its token ids, the processor's image tensors for its
prompt (``multi_modal_inputs``: ``pixel_values`` (patches, patch_dim) and ``image_grid_thw``
(images, 3)) and 3-D rotary positions: ``position_ids`` (B, 3, L) (time, height, width), or
(B, 4, L) with verl's text positions in front. In a ``DataProto`` the image tensors are a
per-row non-tensor (one dict per row, ``None`` or ``{}`` for a row without images); the
engine takes a ``TensorDict``, so :func:`with_multi_modal_inputs` puts them there as a
non-tensor stack, which indexing, concatenation and mini-batch shuffling carry row by row:
each micro-batch plan, by count or by token budget, keeps every row's images with it.

For a micro-batch, :func:`image_model_kwargs` concatenates its rows' tensors along dim 0 in row
order (as the processor would for those rows together, and as the model expects: the image
tokens of the ids are filled with the image features in order), and
:func:`model_position_ids` turns (b, 3, L) positions into the (3, b, L) transformers' Qwen2-VL
forward takes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow import fields as FK
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)
_logged: set[str] = set()


def with_multi_modal_inputs(batch: TensorDict, rows: Sequence[Mapping[str, torch.Tensor] | None]) -> TensorDict:
    """A shallow copy of ``batch`` holding ``rows`` (one image-input dict or None per row)
    under :data:`~hybridflow.fields.MULTI_MODAL_INPUTS`."""
    n = int(batch.batch_size[0])
    if len(rows) != n:
        raise ValueError(f"{FK.MULTI_MODAL_INPUTS}: {len(rows)} entries for a batch of {n} rows")
    for i, row in enumerate(rows):
        if row is not None and not isinstance(row, Mapping):
            raise TypeError(
                f"{FK.MULTI_MODAL_INPUTS}[{i}]: expected a dict of tensors or None, got {type(row).__name__}"
            )
    out = batch.clone(recurse=False)
    # An explicit stack of one entry per row: a stack built from equal entries could collapse.
    out.set(FK.MULTI_MODAL_INPUTS, NonTensorStack(*[NonTensorData(row) for row in rows], batch_size=[n]))
    return out


def engine_batch(data: DataProto) -> TensorDict:
    """``data.batch`` for an engine call, with the rows' ``multi_modal_inputs`` (a
    non-tensor of ``data``) attached when ``data`` has them; else ``data.batch`` itself."""
    if data.batch is None:
        raise ValueError("an engine call needs a DataProto with a tensor batch")
    rows = data.non_tensor_batch.get(FK.MULTI_MODAL_INPUTS)
    if rows is None:
        return data.batch
    return with_multi_modal_inputs(data.batch, list(rows))


def multi_modal_rows(micro: TensorDict) -> list[Mapping[str, torch.Tensor] | None] | None:
    """The image-input dict (or None) of each row of ``micro``; None when it has none attached."""
    if FK.MULTI_MODAL_INPUTS not in micro.keys():
        return None
    value = micro.get(FK.MULTI_MODAL_INPUTS)
    n = int(micro.batch_size[0])
    rows = value.tolist() if isinstance(value, NonTensorStack) else [getattr(value, "data", value)] * n
    if len(rows) != n:
        raise ValueError(f"{FK.MULTI_MODAL_INPUTS}: {len(rows)} entries for a micro-batch of {n} rows")
    return rows


def has_images(micro: TensorDict) -> bool:
    """Whether some row of ``micro`` carries image inputs."""
    return any(row for row in multi_modal_rows(micro) or [])


def uses_rope_3d(micro: TensorDict) -> bool:
    """Whether ``micro``'s position ids are per-axis (b, 3 or 4, L) rather than (b, L)."""
    return FK.POSITION_IDS in micro.keys() and micro[FK.POSITION_IDS].dim() == 3


def is_multimodal(micro: TensorDict) -> bool:
    """Rows with images or 3-D positions: the paths that assume plain (b, L) text rows (packing,
    shared prompts) step aside for them."""
    return uses_rope_3d(micro) or has_images(micro)


def image_model_kwargs(micro: TensorDict, device: torch.device) -> dict[str, torch.Tensor]:
    """The model's image keyword arguments for ``micro``: each key's tensors of its rows,
    concatenated along dim 0 in row order, on ``device``; ``{}`` without images."""
    return concat_image_inputs(multi_modal_rows(micro) or [], device)


def concat_image_inputs(
    rows: Sequence[Mapping[str, torch.Tensor] | None], device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """``rows``' image tensors, each key concatenated along dim 0 in row order (as the processor
    would give them for those rows together), on ``device``; ``{}`` when no row has images."""
    collected: dict[str, list[torch.Tensor]] = {}
    for i, row in enumerate(rows):
        for key, value in (row or {}).items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{FK.MULTI_MODAL_INPUTS}[{i}][{key!r}]: expected a tensor, got {type(value).__name__}")
            collected.setdefault(key, []).append(value)
    return {key: torch.cat(parts, dim=0).to(device) for key, parts in collected.items()}


# Config attributes of Qwen2-VL-family models that name the vision tokens.
_VISION_TOKEN_ATTRS: tuple[str, ...] = (
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "vision_token_id",
)


def vision_token_ids(module: torch.nn.Module) -> tuple[int, ...]:
    """The vision special tokens of a vision-language model (image / video pads, vision start /
    end): ids a sampled response must never hold — an image pad in a response would take an
    image's place in the actor's forward. ``()`` for a model without a vision tower."""
    get_base = getattr(module, "get_base_model", None)  # a PEFT wrapper: the model under it
    inner = get_base() if callable(get_base) else module
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "vision_config", None) is None:
        return ()
    ids = (getattr(config, attr, None) for attr in _VISION_TOKEN_ATTRS)
    return tuple(sorted({int(i) for i in ids if isinstance(i, int) and i >= 0}))


def check_image_tokens(module: torch.nn.Module, input_ids: torch.Tensor, kwargs: Mapping[str, torch.Tensor]) -> None:
    """Raise a clear error when ``input_ids`` hold another number of image tokens than the
    images of ``kwargs`` fill (the model's own message names no cause). A response can hold
    the image token when the rollout sampled it; its rows' images would then be misplaced."""
    grids = kwargs.get("image_grid_thw")
    config = getattr(module, "config", None) or getattr(getattr(module, "backbone", None), "config", None)
    token = getattr(config, "image_token_id", None)
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    if grids is None or token is None or merge is None:
        return
    expected = int((grids.prod(dim=-1) // (merge * merge)).sum())
    found = int((input_ids == token).sum())
    if found != expected:
        raise ValueError(
            f"this micro-batch's rows hold {found} image tokens (id {token}) but their images "
            f"(image_grid_thw) fill {expected}: a response holds the image token (keep the rollout from "
            f"sampling it), or a row's {FK.MULTI_MODAL_INPUTS} belong to another prompt"
        )


def model_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """(b, L) positions as they are; (b, 3, L) → (3, b, L); (b, 4, L) (verl: text positions,
    then time, height, width) → the last three as (3, b, L): the padded path gives the model an
    attention mask, so the text row, which only marks packed sequences, is not needed."""
    if position_ids.dim() == 2:
        return position_ids
    if position_ids.dim() != 3 or position_ids.shape[1] not in (3, 4):
        raise ValueError(
            f"{FK.POSITION_IDS} must be (B, L), (B, 3, L) or (B, 4, L); got shape {tuple(position_ids.shape)}"
        )
    return position_ids[:, -3:].transpose(0, 1)


def log_step_aside(path: str, reason: str) -> None:
    """One log line, once per process, saying that ``path`` is not used and why."""
    if path not in _logged:
        _logged.add(path)
        logger.info("%s is not used for multimodal micro-batches: %s", path, reason)
