"""Moving policy weights from the actor to a rollout that holds its own copy of the model.

Sender side: :func:`iter_weight_buckets` groups ``(name, tensor)`` pairs into buckets of at
most ``bucket_bytes`` (a tensor larger than a bucket travels alone), so a transfer between
processes never materialises more than one bucket at a time. Receiver side:
:func:`hybridflow.inference.weights.load_named_tensors` copies each tensor into the parameter
or buffer of that name (it lives with the inference engine, which loads weights the same way).

When the rollout shares the actor's module (the colocated default) the tensors *are* the
rollout's parameters; they are recognised and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

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
