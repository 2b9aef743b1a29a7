"""Moving policy weights from the actor to a rollout that holds its own copy of the model.

Sender side: :func:`iter_weight_buckets` groups ``(name, tensor)`` pairs into buckets of at
most ``bucket_bytes`` (a tensor larger than a bucket travels alone), so a transfer between
processes never materialises more than one bucket at a time. Receiver side:
:func:`load_named_tensors` copies each tensor into the parameter or buffer of that name.

When the rollout shares the actor's module (the colocated default) the tensors *are* the
rollout's parameters; they are recognised and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import nn

NamedTensorPairs = Iterable[tuple[str, torch.Tensor]]


def iter_weight_buckets(named_tensors: NamedTensorPairs, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``(name, tensor)`` whose sizes add up to at most ``bucket_bytes``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _pairs(weights: Mapping[str, torch.Tensor] | NamedTensorPairs) -> NamedTensorPairs:
    return weights.items() if isinstance(weights, Mapping) else weights


def load_named_tensors(model: nn.Module, weights: Mapping[str, torch.Tensor] | NamedTensorPairs) -> int:
    """Copy ``weights`` into ``model``'s parameters/buffers by ``state_dict`` name.

    Returns the number of tensors copied (a tensor that already is the target is skipped).
    Unknown names and shape mismatches raise ``ValueError`` naming the tensor.
    """
    targets = model.state_dict(keep_vars=True)
    copied = 0
    with torch.no_grad():
        for name, tensor in _pairs(weights):
            if name not in targets:
                suffix = ".".join(name.split(".")[-2:])
                close = [key for key in targets if key.endswith(suffix)]
                hint = f"; similar names: {close[:3]}" if close else ""
                raise ValueError(f"update_weights: the rollout model has no tensor named {name!r}{hint}")
            target = targets[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the rollout model expects {tuple(target.shape)}"
                )
            if tensor is target or (tensor.data_ptr() == target.data_ptr() and tensor.dtype == target.dtype):
                continue
            # copy_ (not .data.copy_) bumps the version counter that packed weights watch.
            target.copy_(tensor)
            copied += 1
    return copied
