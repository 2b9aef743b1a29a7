"""Weights on the wire: ``(name, tensor)`` pairs grouped into buckets, and buckets as bytes.

A trainer pushes its policy to a rollout engine bucket by bucket, so neither side ever holds
more than one bucket of transfer buffers beyond the model itself. :func:`iter_weight_buckets`
groups the pairs (a tensor larger than a bucket travels alone); :func:`bucket_to_bytes` /
:func:`bucket_from_bytes` turn one bucket into the safetensors format and back (bit-exact:
the bytes are the tensors' own, with names, dtypes and shapes in a JSON header), which is
what ``POST /update_weights`` carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

NamedTensorPairs = Iterable[tuple[str, torch.Tensor]]


def named_pairs(weights: Mapping[str, torch.Tensor] | NamedTensorPairs) -> NamedTensorPairs:
    """``(name, tensor)`` pairs from a mapping or an iterable of pairs."""
    return weights.items() if isinstance(weights, Mapping) else weights


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def iter_weight_buckets(named_tensors: NamedTensorPairs, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``(name, tensor)`` whose sizes add up to at most ``bucket_bytes``
    (a tensor larger than that is a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def bucket_to_bytes(bucket: list[tuple[str, torch.Tensor]]) -> bytes:
    """One bucket in the safetensors format. Tensors sharing storage (tied embeddings) are
    each written out in full: the receiver may not tie them."""
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in bucket:
        tensor = tensor.detach().to("cpu")
        if tensor.data_ptr() in seen or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    return st_save(tensors)


def bucket_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of one :func:`bucket_to_bytes` bucket; ValueError when it is not one."""
    try:
        return st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise ValueError(f"the body is not a safetensors bucket ({err})") from err


def safetensors_buckets(named_tensors: NamedTensorPairs, bucket_bytes: int) -> Iterator[bytes]:
    """:func:`iter_weight_buckets`, each bucket as bytes."""
    for bucket in iter_weight_buckets(named_tensors, bucket_bytes):
        yield bucket_to_bytes(bucket)
